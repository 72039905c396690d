"""loopscale: how much is one recurrence worth to a looped language model?

The package is layered so that fitting never needs torch:
``accounting``/``config`` -> ``model``/``data``/``optim`` -> ``train`` -> ``sweep``/``eval``;
``fit`` and ``report`` depend only on ``accounting`` and the scientific Python stack.
"""

__version__ = "0.1.0"
