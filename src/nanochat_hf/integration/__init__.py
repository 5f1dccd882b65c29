"""nanochat's optimizer inside a `transformers.Trainer`: the mixin, the gradient contract with DDP/Accelerate, the
Muon momentum callback and the optimizer-state file format. Layering: optim/ < integration/ < training/, conversion/
(this package imports optim/ only; tests/test_layering.py checks it)."""

from ..lazy import lazy_exports

# imported on first use (see nanochat_hf.lazy): the file format alone needs no Trainer
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "NanoChatOptimizerMixin": "mixin",
        "check_distributed_setup": "mixin",
        "MuonMomentumCallback": "momentum",
        "muon_momentum": "momentum",
    },
)

__all__ = ["MuonMomentumCallback", "NanoChatOptimizerMixin", "check_distributed_setup", "muon_momentum"]
