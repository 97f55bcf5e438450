"""ServeTwin's analytical hardware model: GPU / model / engine specs and the step-cost ledger.

Never imports simpy or twin; data files are read lazily on first use and cached.
"""

from hardware._data import UnknownName
from hardware.calibration import (Calibration, Collective, Roofline, calibration_for, calibration_for_engine,
                                  load_calibration)
from hardware.cost import TERMS, CostModel, StepCost
from hardware.deployment import Deployment, DeploymentError
from hardware.dtypes import DTYPE_BYTES
from hardware.engine import EngineProfile, list_engines, load_engine
from hardware.gpu import GPUSpec, list_gpus, load_gpu
from hardware.model import ModelSpec, list_models, load_model
from hardware.shape import BatchShape

__all__ = [
    "BatchShape", "Calibration", "Collective", "Roofline", "calibration_for", "calibration_for_engine", "CostModel", "DTYPE_BYTES", "Deployment", "DeploymentError", "EngineProfile", "GPUSpec",
    "ModelSpec", "StepCost", "TERMS", "list_engines", "list_gpus", "list_models", "load_calibration",
    "load_engine", "load_gpu", "load_model", "UnknownName",
]
