"""The model size ``d`` a plan is made for, from the experiment config (``testbed plan``,
``testbed calibrate``)."""

from __future__ import annotations

from testbed.core.config.experiment import ExperimentConfig


def count_params(cfg: ExperimentConfig) -> int:
    """Model size d of the config's model (builds it; imports torch)."""
    from testbed.core.extensions import is_import_string
    from testbed.core.models import build_model, n_params

    shape: tuple[int, ...] = (3, 32, 32) if cfg.dataset == "cifar10" else (1, 28, 28)
    n_classes = 10
    if is_import_string(cfg.dataset):  # a lab's own data: its sample shape and labels
        from testbed.core.run_setup import prepare_test_data

        data = prepare_test_data(cfg)
        shape, n_classes = tuple(data.x_test.shape[1:]), data.n_classes
    return n_params(build_model(cfg.model, shape, seed=0, n_classes=n_classes,
                                extensions_path=cfg.extensions_path))
