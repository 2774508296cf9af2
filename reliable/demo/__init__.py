"""``reliable demo``: the whole pipeline end to end, with a seeded chaos schedule and a ledger that proves it.

Modules: :mod:`.runner` (orchestration), :mod:`.ledger` (the business effect and its invariant),
:mod:`.worker` (a consumer process), :mod:`.topology` (processes or threads), :mod:`.services` (child
processes), :mod:`.chaos` (the fault schedule), :mod:`.transport` (client-side faults), :mod:`.stats` and
:mod:`.summary` (what is reported), :mod:`.progress` (the live display), :mod:`.reconcile` (the Spark step),
:mod:`.parts` (the seams to the other parts).
"""
