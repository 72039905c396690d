"""MuonH: Muon's orthogonalised momentum, with every matrix kept on the sphere of its initial norm.

For a matrix W (shape m x n) with gradient G, momentum mu, Nesterov, learning rate eta, and
rho = ||W_0||_F its Frobenius norm when the optimiser was built::

    B <- mu B + (1 - mu) G                     momentum buffer (Muon's lerp form)
    U <- (1 - mu) G + mu B                     Nesterov; U = B without Nesterov
    O <- NS5(U)                                 ~ U V^T for U = U S V^T: all singular values ~1
    W <- rho * N(W - eta * rho * N(O))          N(X) = X / ||X||_F

so ||W||_F = rho after every step and the step moves W by an angle of about eta radians. This is
"Hyperball" optimisation with Muon as the base update (Wen, Dang, Lyu, Ma, Liang 2025, "Fantastic
Pretraining Optimizers and Where to Find Them 2.1: Hyperball Optimization", MuonH); Muon's own
shape factor max(1, m/n)^0.5 disappears in N(O). There is no weight decay: the projection fixes the norm.

NS5 is the quintic Newton-Schulz iteration of Muon (Jordan et al. 2024, https://kellerjordan.github.io/
posts/muon/; modded-nanogpt): X <- X / ||X||_F, then 5 times X <- a X + (b A + c A^2) X, A = X X^T,
with (a, b, c) = (3.4445, -4.7750, 2.0315); wide orientation (transpose tall matrices). It maps singular
values into roughly [0.7, 1.2] rather than exactly 1, which is what Muon uses. The "polar express"
coefficients (Amsel et al. 2025) are not implemented.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(G: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Approximately orthogonalise the last two dims of ``G`` (a matrix or a batch of same-shape matrices).

    ``dtype`` is the compute precision (default ``G.dtype``; Muon uses bfloat16 on GPU). The result has
    ``G``'s dtype and shape.
    """
    if G.ndim < 2:
        raise ValueError(f"newton_schulz5 needs a matrix, got shape {tuple(G.shape)}")
    a, b, c = NS_COEFFS
    X = G.to(dtype or G.dtype)
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if tall:
        X = X.mT
    return X.to(G.dtype)


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.mT if x.size(-2) > x.size(-1) else x


def _ns_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[choice]


class MuonH(torch.optim.Optimizer):
    """Hyperspherical Muon for 2-D parameters (update rule in the module docstring).

    ``state[p]`` holds ``init_norm`` (rho, a Python float, captured here from the weights as they are
    now) and ``momentum_buffer``; both travel in ``state_dict()``, so a resumed run projects onto the
    same spheres as the original even if the optimiser was rebuilt on other weights before loading.
    Matrices of one shape (up to transposition) are orthogonalised together in one batched
    Newton-Schulz call.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter] | Iterable[dict], lr: float = 0.014,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 ns_dtype: str = "auto") -> None:
        if lr < 0:
            raise ValueError(f"lr must be non-negative (got {lr})")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1) (got {momentum})")
        if ns_dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"ns_dtype must be 'auto', 'bfloat16' or 'float32' (got {ns_dtype!r})")
        defaults = {"lr": lr, "momentum": momentum, "nesterov": nesterov, "ns_steps": ns_steps,
                    "ns_dtype": ns_dtype}
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"MuonH takes 2-D parameters only, got shape {tuple(p.shape)}")
                self._capture_norm(p)

    def _capture_norm(self, p: torch.nn.Parameter) -> float:
        rho = float(p.detach().float().norm())
        if not rho > 0:
            raise ValueError(f"MuonH: a parameter of shape {tuple(p.shape)} has zero Frobenius norm; the "
                             "hyperspherical update keeps ||W||_F at its initial value, so it cannot start "
                             "from zero (do not zero-initialise matrices optimised by MuonH)")
        self.state[p]["init_norm"] = rho
        return rho

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            buckets: dict[tuple, list[torch.nn.Parameter]] = {}
            for p in params:  # m x n and n x m share a bucket: tall matrices are transposed to wide
                buckets.setdefault((min(p.shape), max(p.shape), p.dtype, p.device), []).append(p)
            for bucket in buckets.values():
                self._update_bucket(bucket, group)
        return loss

    def _update_bucket(self, params: list[torch.nn.Parameter], group: dict) -> None:
        mu, lr = group["momentum"], group["lr"]
        updates = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1.0 - mu)
            updates.append(_wide(p.grad.lerp(buf, mu) if group["nesterov"] else buf))
        U = torch.stack(updates)
        O = newton_schulz5(U, group["ns_steps"], _ns_dtype(group["ns_dtype"], U.device)).float()
        rho = torch.tensor([self.state[p].get("init_norm") or self._capture_norm(p) for p in params],
                           dtype=torch.float32, device=U.device).view(-1, 1, 1)
        O = O / (O.norm(dim=(-2, -1), keepdim=True) + 1e-12)
        W = torch.stack([_wide(p.detach()).float() for p in params])
        W = W - (lr * rho) * O
        W = W * (rho / W.norm(dim=(-2, -1), keepdim=True))
        for p, w in zip(params, W.unbind(0), strict=True):
            p.copy_(w.mT if p.size(0) > p.size(1) else w)
