"""vLLM plugin (entry point ``vllm.general_plugins``): registers vime_ext's weight-transfer engine.

vLLM loads general plugins in every process it starts, so the engine is known to the workers that build it.
Selected with ``--weight-transfer-config '{"backend": "vime_shm"}'``.
"""

SHM_BACKEND = "vime_shm"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if SHM_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(SHM_BACKEND, "vime_ext.engines.shm_weight_transfer",
                                                    "SharedMemoryWeightTransferEngine")
