"""``codepost verify-server``: the warm sandbox pool behind an HTTP API, for any trainer.

* ``POST /run_code``: SandboxFusion's schema for the sandbox's languages (Python, C++,
  JavaScript), so its
  clients (the ``sandbox-fusion`` package, verl's ``reward_model.sandbox_fusion``) work
  unchanged;
* ``POST /verify``: ``codepost verify`` samples in, the same verdicts and rewards out;
* ``GET /health``, and ``GET /metrics`` in Prometheus text format.

Every job accepted is answered. The server holds at most ``max_pending`` jobs (running or
waiting for a container) and ``max_pending_bytes`` of request bodies, and refuses the next
request at once with 429 and Retry-After instead of building a backlog. A caller whose deadline
is known (verl's reward: its time-outs plus 10 s) is never left to run out of time in the queue:
a job of its that can no longer start in time is withdrawn unstarted and answered with the
status that caller retries (504), and its retry keeps its place. SIGTERM stops new
connections, lets the accepted requests finish, then closes the pool, so no container is left
behind. Hostile callers are bounded before the work is done: a body's size before it is read,
list lengths before their items are validated, an inline problem's size and test count before
its jobs are built (off the event loop, once per problem), and the size of every error answer.

The package: :mod:`.config` (its settings), :mod:`.admission` (capacity, the queue in front of
the pool, the callers whose deadline is known), :mod:`.run_code` and :mod:`.verify` (the two
endpoints' requests and answers), :mod:`.app` (the routes and metrics) and :mod:`.command`
(``codepost verify-server``).
"""
