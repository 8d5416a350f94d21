"""PATE: private aggregation of teacher ensembles (Papernot et al., ICLR 2017 and ICLR 2018).

    shards.py       disjoint, seeded partition of the private training set (one shard per teacher)
    ensemble.py     many teachers as one module with stacked parameters (trained all at once)
    teachers.py     training the teachers on their shards, their votes, their accuracy
    aggregation.py  the noisy aggregators: LNMax, GNMax, Confident GNMax (numpy, seeded)
    student.py      the student: supervised on released labels, optionally semi-supervised
    run.py          a whole PATE run for the runner: teachers -> queries -> student

The privacy analysis is pure math in `engine.privacy.pate` and `engine.privacy.pate_smooth`.
Teachers saw the raw private data and carry no guarantee: they never leave this package (no
artifact, no event carries their parameters); only the student is saved.
"""
