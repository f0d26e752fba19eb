"""Adapters to other FL frameworks; each subpackage needs its optional extra installed.

Nothing else in fedunlearn imports this package (an import-linter ``layers`` contract keeps it
so): ``fedunlearn.integrations.flower`` needs ``pip install "fedunlearn[flower]"``.
"""
