"""The training loop, checkpoints, run directory, callbacks and the termination message.

Torch is imported inside functions only.
"""

from npu_lora.train.callbacks import CallbackList, ProgressBar, RunContext, TrainCallback
from npu_lora.train.loop import NonFiniteLoss, Trainer, TrainResult, seed_everything
from npu_lora.train.termination import write_termination_message

__all__ = [
    "CallbackList",
    "NonFiniteLoss",
    "ProgressBar",
    "RunContext",
    "TrainCallback",
    "TrainResult",
    "Trainer",
    "seed_everything",
    "write_termination_message",
]
