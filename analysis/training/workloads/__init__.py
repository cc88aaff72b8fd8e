"""Built-in workloads that train for real on data shipped with the libraries (no download).

``get_workload("lenet")`` or ``get_workload("linreg:variant=ecq,d=512")``; ``workload_names()`` lists them.
"""

from gradstat.analysis.training.workloads.base import Workload
from gradstat.analysis.training.workloads.registry import get_workload, register, workload_names

# Each module registers its workload on import (this order is the listing order).
# isort: off
from gradstat.analysis.training.workloads import fc300, lenet, resnet20, lstm, logreg, linreg  # noqa: F401,E402
# isort: on

__all__ = ["Workload", "get_workload", "register", "workload_names"]
