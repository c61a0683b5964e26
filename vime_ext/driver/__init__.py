"""The driver: the process that runs a training job and the processes it starts (``docs/architecture.md``).

- ``loop.py``: the loop (rollout, train, push, log, evaluate); ``python -m vime_ext.train``
  (``vime_ext/train.py``) runs it.
- ``step.py``: the trainer ranks' side of one step (sequences, optimizer steps, metrics).
- ``handover.py``: weights and GPUs between trainer ranks and engines (the policy: ``vime_ext/gpu_sharing.py``).
- ``recovery.py``: save, resume, restart after a dead trainer rank, the time limit.
- ``async_rollouts.py``: ``--async-training``'s producer of rollouts ahead of the trainer.
- ``cluster.py``: the Ray placement, the trainer ranks and the rollout manager as typed proxies.
- ``rollout_manager.py``: the Ray actor that owns the engines, the router, the data and the rollout plug-ins.
"""
