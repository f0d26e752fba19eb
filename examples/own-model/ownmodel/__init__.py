"""A user's own package for fedunlearn: a small CNN with BatchNorm and a loader over an .npz.

Nothing here imports fedunlearn: the config names ``ownmodel.nets:make`` (the model factory) and
``ownmodel.data:load`` (the data source), and fedunlearn calls them.
"""
