"""SpiderCache's elastic cache manager (ICPP'25 section 4.3): the share of the cache
given to the Importance Cache (``imp_ratio``), the rest going to the Homophily Cache.

* Importance monitor (Eq. 5): ``beta = 1`` once the slope of the standard deviation of
  the importance scores (a least-squares fit over the last ``window`` observations)
  is negative, else 0.
* Accuracy monitor (Eq. 6): accuracy smoothed by a Savitzky-Golay filter
  (``scipy.signal.savgol_filter``, window ``window``, order 2) and its mean growth over
  the last ``window`` steps, ``Delta``.
* Penalty (Eq. 7): ``u = Delta / (gamma + Delta)`` (``Delta`` floored at 0).
* Ratio controller (Eq. 8): ``imp_ratio(t) = r_start - beta (r_start - r_end) (t/T)^(1+u)``.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError

NOISE = 1e-9  # accuracy growth per step below this is rounding, not learning
REL_NOISE = 1e-6  # a relative change of the scores' std below this is rounding too


class RatioController:
    def __init__(
        self,
        total: float,
        r_start: float = 0.9,
        r_end: float = 0.8,
        gamma: float = 0.01,
        window: int = 5,
    ) -> None:
        if total <= 0:
            raise ConfigError(f"total training length T must be > 0, got {total}")
        if not 0.0 <= r_end <= r_start <= 1.0:
            raise ConfigError(f"need 0 <= r_end <= r_start <= 1, got {r_start}, {r_end}")
        if gamma <= 0 or window < 2:
            raise ConfigError(f"need gamma > 0 and window >= 2, got {gamma}, {window}")
        self.total, self.r_start, self.r_end = float(total), float(r_start), float(r_end)
        self.gamma, self.window = float(gamma), int(window)
        self.stds: list[float] = []
        self.accuracies: list[float] = []

    def observe_scores(self, scores: np.ndarray) -> None:
        self.stds.append(float(np.std(scores)))

    def observe_accuracy(self, accuracy: float) -> None:
        self.accuracies.append(float(accuracy))

    def beta(self) -> int:
        """Eq. 5: 1 when the std of the scores is falling."""
        s = self.stds[-self.window :]
        if len(s) < 2:
            return 0
        slope = np.polyfit(np.arange(len(s)), s, 1)[0]
        return int(slope < -REL_NOISE * max(abs(float(np.mean(s))), NOISE))  # not rounding

    def delta(self) -> float:
        """Eq. 6: the mean growth of the smoothed accuracy over the last ``window`` steps."""
        a = np.asarray(self.accuracies, np.float64)
        if a.size < 2:
            return 0.0
        if a.size >= self.window:
            from scipy.signal import savgol_filter

            a = savgol_filter(a, window_length=self.window, polyorder=2)
        steps = min(self.window, a.size - 1)
        return float((a[-1] - a[-1 - steps]) / steps)  # the telescoped sum of Eq. 6

    def u(self) -> float:
        d = self.delta()
        d = d if d > NOISE else 0.0  # a flat accuracy smoothed is not exactly flat
        return d / (self.gamma + d)  # Eq. 7

    def ratio(self, t: float) -> float:
        """Eq. 8 at training time ``t`` (same unit as ``total``)."""
        frac = min(max(t / self.total, 0.0), 1.0)
        return self.r_start - self.beta() * (self.r_start - self.r_end) * frac ** (1.0 + self.u())
