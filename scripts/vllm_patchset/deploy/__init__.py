"""The overlay on an installed vLLM: apply, verify, revert, the runtime guard, the packed wheel
(the commands are `commands/deploy.py` and `commands/overlay.py`):

    target.py       the install deployed to (`Target`): its package, its state dir, the lock
    record.py       the record (the commit point of an apply) and the journal, and their JSON
    plan.py         the planner: hashes, lock and record in, a `Plan` out (it reads nothing)
    transaction.py  a `Transaction` over the durable journal (begin, mark done, commit, roll
                    back), and the recovery of a killed run
    operations.py   apply, revert, verify, status, diff: plan once, under the lock, then a
                    transaction
    bytecode.py     the pycs beside an overlaid module
    report.py       what a command reports; the unified diff
    source.py       the overlay to deploy (a checkout's, or one packed into a wheel)
    pack.py         the wheel of the tool with the overlay inside
    guard.py        the vLLM plugin that checks the install at every start (stdlib only)
"""
