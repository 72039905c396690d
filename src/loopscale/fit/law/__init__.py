"""The joint law and its estimator (arXiv 2604.21106, Sec. 1 / Eq. 1 and Sec. 5).

``formula``: the law's mathematics (N_eq, theta slots, residuals and Jacobian, predictions);
``solver``: the objective and the batched multi-start search every fitter drives;
``joint``: ``JointLaw``, the scikit-learn-style estimator; ``variants`` / ``structure``: law variants
fitted beside it (the loop-structure factor); ``threads``: one BLAS thread inside the batched solver.
"""

from loopscale.fit.law.joint import JointLaw, NotFittedError, clone

__all__ = ["JointLaw", "NotFittedError", "clone"]
