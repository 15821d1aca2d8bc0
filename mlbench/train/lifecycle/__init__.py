"""A run's lifecycle around the loop: what keeps its work, and how it starts, stops and ends.

`space` checks at start-up that there is room for what the run writes; `runrecord`
writes `run.json` (the run as requested) and `resume` says what `--resume` may change;
`lease` keeps one live run per run folder; `checkpoint` saves (orbax, asynchronous),
`failed_saves` survives saves that fail, `agreement` has a multi-host run's processes agree
on every save (with a deadline on every wait) and `restore` reads the newest usable
checkpoint back; `signals` turns SIGTERM/SIGINT into a clean stop with a final save, `peers`
notices dead processes of a multi-host run; `filing` files the run's log as a result or
keeps it with the run, and `refile` files on `--resume` the kept log of a run that reached
its target. The runner and the loop use them; none of them trains.
"""
