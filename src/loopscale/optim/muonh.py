"""MuonH: Muon's orthogonalised momentum, with every matrix kept on the sphere of its initial norm.

For a matrix W (shape m x n) with gradient G, momentum mu, Nesterov, learning rate eta, and
rho = ||W_0||_F its Frobenius norm when the optimiser was built::

    B <- mu B + (1 - mu) G                     momentum buffer (Muon's lerp form)
    U <- (1 - mu) G + mu B                     Nesterov; U = B without Nesterov
    O <- orth(U)                               ~ U V^T for U = U S V^T: all singular values ~1
    W <- rho * N(W - eta * rho * N(O))          N(X) = X / ||X||_F

so ||W||_F = rho after every step and the step moves W by an angle of about eta radians. This is
"Hyperball" optimisation with Muon as the base update (MuonH; arXiv 2603.28743, as the paper's
``muon_step_fused`` in ``nanochat/optim.py``); Muon's own shape factor max(1, m/n)^0.5 disappears in
N(O). There is no weight decay: the projection fixes the norm.

``orth`` runs five quintic iterations X <- a X + (b A + c A^2) X with A = X X^T on the wide orientation
(tall matrices are transposed), in the compute dtype (``ns_dtype``):

- ``polar_express`` (the paper's): per-step coefficients of Polar Express (Amsel, Persson, Musco,
  Gower 2025, arXiv 2505.16932; the paper code's values for 5 steps), after X <- X / (1.02 ||X||_F + 1e-6);
- ``ns5``: Muon's fixed (3.4445, -4.7750, 2.0315) (Jordan et al. 2024; modded-nanogpt), after
  X <- X / (||X||_F + 1e-7). It maps singular values into roughly [0.7, 1.2] instead of near 1.

The scaling ``rho * N(O)`` and the step ``eta * (.)`` are computed in the compute dtype too, as the
paper's code does (in bfloat16 it rounds ``eta`` and the update to bfloat16); the weights and their
re-projection stay in fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

NS_COEFFS = (3.4445, -4.7750, 2.0315)
# Polar Express for 5 steps (arXiv 2505.16932, safety factor 2e-2, cushion 2), as the paper's code lists them.
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
POLAR_EXPRESS_SAFETY = 1.02
ORTHOGONALIZERS = ("polar_express", "ns5")


def orthogonalize(
    G: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None, method: str = "polar_express"
) -> torch.Tensor:
    """Approximately orthogonalise the last two dims of ``G`` (a matrix or a batch of same-shape matrices).

    ``dtype`` is the compute precision (default ``G.dtype``); the result is in that dtype, ``G``'s shape.
    """
    if G.ndim < 2:
        raise ValueError(f"orthogonalize needs a matrix, got shape {tuple(G.shape)}")
    if method == "polar_express":
        if not 1 <= steps <= len(POLAR_EXPRESS_COEFFS):
            raise ValueError(f"polar_express has coefficients for 1..{len(POLAR_EXPRESS_COEFFS)} steps, got {steps}")
        coeffs, safety, eps = POLAR_EXPRESS_COEFFS[:steps], POLAR_EXPRESS_SAFETY, 1e-6
    elif method == "ns5":
        coeffs, safety, eps = (NS_COEFFS,) * steps, 1.0, 1e-7
    else:
        raise ValueError(f"unknown orthogonalizer {method!r}; expected one of {ORTHOGONALIZERS}")
    X = G.to(dtype or G.dtype)
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * safety + eps)
    if X.dtype == torch.bfloat16:  # round each term to bf16 as the paper's code does (parity tests)
        for a, b, c in coeffs:
            A = X @ X.mT
            B = b * A + c * (A @ A)
            X = a * X + B @ X
        return X.mT if tall else X
    batched = X.ndim > 2
    X = X if batched else X.unsqueeze(0)
    for a, b, c in coeffs:
        # b A + c A A and a X + B X as one GEMM each (beta/alpha): the scalings and sums make no pass of
        # their own over the stack (on CPU a tenth of the orthogonalisation; bench/RESULTS.md, issue 20)
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    X = X if batched else X.squeeze(0)
    return X.mT if tall else X


def newton_schulz5(G: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Muon's fixed-coefficient iteration (``method = 'ns5'``), returned in ``G``'s dtype."""
    return orthogonalize(G, steps, dtype, "ns5").to(G.dtype)


def _dist_world() -> tuple[int, int]:
    """(world size, rank) of the default process group, or (1, 0) when none is initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def sharded_orthogonalize(U: torch.Tensor, steps: int, dtype: torch.dtype, method: str) -> torch.Tensor:
    """``orthogonalize`` of a stack of matrices split across the ranks of the default process group.

    Under DDP the gradients (and so the momentum and ``U``) are identical on every rank, so computing every
    orthogonalisation on every rank repeats the optimiser's most expensive work ``world`` times. Here rank
    ``k`` takes matrices ``k, k + world, ...`` and an all-gather hands every rank all results, as the
    paper's ``DistMuonAdamW`` shards its Polar Express. All ranks end with the same bits (each matrix has one
    owner); against one process the results differ only by float reassociation of the smaller batches.
    """
    import torch.distributed as dist

    world, rank = _dist_world()
    n = U.size(0)
    if world == 1 or n == 1:
        return orthogonalize(U, steps, dtype, method)
    per_rank = -(-n // world)
    mine = orthogonalize(U[rank::world], steps, dtype, method)
    # gloo has no bfloat16 collectives: move the results in float32 there (exact for bf16 values)
    wire = torch.float32 if dist.get_backend() == "gloo" else mine.dtype
    send = torch.zeros((per_rank, *U.shape[1:]), dtype=wire, device=U.device)
    send[: mine.size(0)] = mine.to(wire)
    parts = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(parts, send)
    out = torch.empty((n, *U.shape[1:]), dtype=mine.dtype, device=U.device)
    for k, part in enumerate(parts):
        count = len(range(k, n, world))
        out[k::world] = part[:count].to(mine.dtype)
    return out


def wide(x: torch.Tensor) -> torch.Tensor:
    """The wide orientation of a matrix (or of the last two dims of a stack): tall ones transposed."""
    return x.mT if x.size(-2) > x.size(-1) else x


def ns_compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    """The orthogonalisation's dtype for ``ns_dtype = choice`` on ``device`` ("auto": bf16 on CUDA, else fp32)."""
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[choice]


class MuonH(torch.optim.Optimizer):
    """Hyperspherical Muon for 2-D parameters (update rule in the module docstring).

    ``state[p]`` holds ``init_norm`` (rho, a Python float, captured here from the weights as they are
    now) and ``momentum_buffer``; both travel in ``state_dict()``, so a resumed run projects onto the
    same spheres as the original even if the optimiser was rebuilt on other weights before loading.
    Matrices of one shape (up to transposition) are orthogonalised together in one batched call; under
    torch.distributed (``shard``, default) each rank orthogonalises its share and all-gathers the rest.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict],
        lr: float = 0.014,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_dtype: str = "auto",
        orthogonalizer: str = "polar_express",
        shard: bool = True,
    ) -> None:
        if lr < 0:
            raise ValueError(f"lr must be non-negative (got {lr})")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1) (got {momentum})")
        if ns_dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"ns_dtype must be 'auto', 'bfloat16' or 'float32' (got {ns_dtype!r})")
        if orthogonalizer not in ORTHOGONALIZERS:
            raise ValueError(f"orthogonalizer must be one of {ORTHOGONALIZERS} (got {orthogonalizer!r})")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "ns_dtype": ns_dtype,
            "orthogonalizer": orthogonalizer,
            "shard": shard,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"MuonH takes 2-D parameters only, got shape {tuple(p.shape)}")
                self._capture_norm(p)

    def _capture_norm(self, p: torch.nn.Parameter) -> float:
        rho = float(p.detach().float().norm())
        if not rho > 0:
            raise ValueError(
                f"MuonH: a parameter of shape {tuple(p.shape)} has zero Frobenius norm; the "
                "hyperspherical update keeps ||W||_F at its initial value, so it cannot start "
                "from zero (do not zero-initialise matrices optimised by MuonH)"
            )
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
            grad = p.grad
            assert grad is not None  # step() buckets only parameters with a gradient
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1.0 - mu)
            updates.append(wide(grad.lerp(buf, mu) if group["nesterov"] else buf))
        U = torch.stack(updates)
        dt = ns_compute_dtype(group["ns_dtype"], U.device)
        # a param group restored from a checkpoint written before Polar Express existed has no key: NS5 ran then
        method = group.get("orthogonalizer", "ns5")
        if group.get("shard", True):
            O = sharded_orthogonalize(U, group["ns_steps"], dt, method)
        else:
            O = orthogonalize(U, group["ns_steps"], dt, method)
        rho = torch.tensor(
            [self.state[p].get("init_norm") or self._capture_norm(p) for p in params],
            dtype=torch.float32,
            device=U.device,
        ).view(-1, 1, 1)
        O = O * (rho.to(dt) / O.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))  # ||O||_F = rho
        W = torch.stack([wide(p.detach()).float() for p in params])
        W = W - torch.tensor(lr, dtype=torch.float32, device=U.device).to(dt) * O
        W = W * (rho / W.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))
        for p, w in zip(params, W.unbind(0), strict=True):
            p.copy_(w.mT if p.size(0) > p.size(1) else w)
