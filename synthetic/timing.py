"""Clock: dwell between actions, gaps between a shopper's sessions, history timestamps.

Gaps between adjacent sessions of one shopper follow UserArena's shape: 34.6 %
under 5 minutes, 13.3 % over 12 hours, log-uniform inside each band. A gap is
measured from the previous session's last event to the next session's first.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from transforms.schemas import ACTIONS

WINDOW_START_MS = int(datetime(2024, 6, 3, tzinfo=UTC).timestamp() * 1000)
FIRST_SESSION_SPREAD_DAYS = 14.0
DAY_MS = 86_400_000
GAP_SHORT, GAP_LONG = 0.346, 0.133  # shares of gaps < 5 min and > 12 h
GAP_BANDS_S = ((8.0, 300.0), (300.0, 43_200.0), (43_200.0, 7 * 86_400.0))
# Median seconds spent after each action before the next one (reading, deciding).
DWELL_S = {
    "scroll_down": 3.0,
    "scroll_up": 3.0,
    "click": 2.5,
    "end": 1.0,
    "ipv_scroll_down": 4.5,
    "ipv_scroll_up": 3.5,
    "ipv_swipe_pic": 2.5,
    "ipv_click_param": 6.0,
    "ipv_enter_comment": 5.0,
    "ipv_click_comment": 9.0,
    "ipv_cart": 3.0,
    "ipv_buy": 8.0,
    "back_home": 2.0,
}
_DWELL_MEDIAN_MS = np.array([DWELL_S[a] * 1000 for a in ACTIONS])


def dwell_ms(rng: np.random.Generator, action: np.ndarray) -> np.ndarray:
    """Time after each action until the next, >= 300 ms so timestamps strictly increase."""
    return np.maximum(np.rint(_DWELL_MEDIAN_MS[action] * rng.lognormal(0, 0.55, len(action))), 300).astype(
        np.int64
    )


def session_gaps_ms(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gaps between adjacent sessions: a three-band log-uniform mixture."""
    band = np.searchsorted([GAP_SHORT, 1.0 - GAP_LONG], rng.random(n), side="right")
    lo = np.log(np.array([b[0] for b in GAP_BANDS_S]))[band]
    hi = np.log(np.array([b[1] for b in GAP_BANDS_S]))[band]
    return np.rint(np.exp(lo + rng.random(n) * (hi - lo)) * 1000).astype(np.int64)


def session_starts_ms(
    rng: np.random.Generator, user: np.ndarray, first: np.ndarray, duration_ms: np.ndarray
) -> np.ndarray:
    """Start time of each session (sessions sorted by user, then order); sessions never overlap."""
    n = len(user)
    origin = WINDOW_START_MS + np.rint(rng.random(n) * FIRST_SESSION_SPREAD_DAYS * DAY_MS).astype(np.int64)
    gaps = session_gaps_ms(rng, n)
    # step from the previous session = its duration + the gap; zero at each user's first session
    step = np.where(first, 0, np.r_[0, duration_ms[:-1]] + gaps)
    total = np.cumsum(step)
    first_idx = np.flatnonzero(first)
    owner = np.cumsum(first) - 1  # index of the user's first session among first_idx
    return origin[first_idx][owner] + total - total[first_idx][owner]
