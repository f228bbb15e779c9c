"""The pure core of the join: the reducer (``reducer``), the closing decision (``closing``) and
the output records built from a decision (``outcomes``).

No module here imports Apache Beam: the streaming ``JoinDoFn`` and the bounded plan both call
this code, and it can be tested and benchmarked as plain Python.
"""
