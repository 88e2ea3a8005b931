"""The engine: what every method, metric and application runs on, below the methods.

From the top, each layer importing only the layers below it (``lint-imports`` checks it):

- :mod:`~heedful.engine.reuse` -- removal scores continuing a key/value prefix cache;
- :mod:`~heedful.engine.runner` -- many copies of each example, chunked, run forward / backward;
- :mod:`~heedful.engine.problem` -- ``prepare``: encode, anchor, one reference pass, target;
  :mod:`~heedful.engine.workload` -- what a request costs, checked before any work;
- :mod:`~heedful.engine.targets` (what is explained), :mod:`~heedful.engine.perturb` (tokens
  removed), :mod:`~heedful.engine.seeding`, :mod:`~heedful.engine.sequences` (continuations),
  :mod:`~heedful.engine.conversation` (chat templates);
- (the adapters, :mod:`heedful.adapters`, the only code that knows architectures);
- :mod:`~heedful.engine.batch`, :mod:`~heedful.engine.chunks`, :mod:`~heedful.engine.memory`
  (the budget and the estimate of a pass), :mod:`~heedful.engine.options` (method options from
  signatures), :mod:`~heedful.engine.precision` (bf16 / int8 forward passes),
  :mod:`~heedful.engine.readable` (tokens as people read them);
- :mod:`~heedful.engine.machine` (the processor), :mod:`~heedful.engine.sources` (a text cut
  into sources).
"""
