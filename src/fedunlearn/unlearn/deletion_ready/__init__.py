"""Deletion-ready training's methods (the ``deletion_ready`` plugin): exact and mostly free.

``tv_exact`` serves a run trained with TV-stable sampling (``training.sampling: tv_stable``;
Tao et al., "Communication Efficient and Provable Federated Unlearning", PVLDB 17(5) 2024, FATS):
it recomputes only from the first round that drew a forgotten client or used a deleted sample,
and most requests recompute nothing. ``shard_retrain`` serves a sharded run
(``training.shards``; SISA for FL): it retrains only the shards that held the data. Both return
results whose lineage is ``exact`` (the evidence is the construction). ``plugin`` declares them.
Design note: docs/methods/deletion_ready.md.
"""
