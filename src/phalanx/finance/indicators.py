"""Technical indicators as batched torch operations over a ``(T, S)`` price tensor, on any device.

Everything is causal (bar ``t`` uses bars ``<= t`` only) and computed once, for all tickers and bars
at once: rolling windows by cumulative sums, exponential averages by a blocked linear-recurrence scan
(:func:`linear_recurrence`: matrix products within blocks of 64 bars, a recursion over the block ends),
so that even minute bars of many years need no Python loop over time.

:func:`trading_features` turns prices into the scale-free, normalised features the trading env
observes (see its docstring for the list).
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor

FEATURE_NAMES = ("ret1", "ret5", "ma10", "ma50", "rsi14", "macd", "vol20", "volume20")
"""The per-ticker features of :func:`trading_features`, in order."""
WARMUP_BARS = 50
"""Bars of history the features need (the longest window, the 50-bar moving average)."""
FEATURE_CLIP = 5.0


def linear_recurrence(u: Tensor, decay: float, block: int = 64) -> Tensor:
    """``y[t] = decay * y[t-1] + u[t]`` along dim 0 with ``y[-1] = 0``; ``u`` is ``(T, ...)``.

    Within blocks of ``block`` steps the solution with zero carry-in is one matrix product with the
    lower-triangular ``decay ** (j - k)``; the carries between blocks follow the same recurrence with
    ``decay ** block`` over the block ends, solved recursively. Exact up to rounding, O(T * block).
    """
    steps = u.shape[0]
    flat = u.reshape(steps, -1)  # (T, M)
    size = min(block, steps)
    j = torch.arange(size, device=u.device, dtype=u.dtype)
    power = (j[:, None] - j[None, :]).clamp(min=0)
    kernel = torch.where(j[:, None] >= j[None, :], decay**power, torch.zeros_like(power))  # (B, B)
    if steps <= size:
        return (kernel @ flat).reshape(u.shape)
    blocks = math.ceil(steps / size)
    padded = torch.cat([flat, flat.new_zeros(blocks * size - steps, flat.shape[1])])
    columns = padded.shape[1]
    stacked = padded.reshape(blocks, size, columns).transpose(0, 1).reshape(size, blocks * columns)
    within = (kernel @ stacked).reshape(size, blocks, columns).transpose(0, 1)  # (nb, B, M), no carry-in
    ends = linear_recurrence(within[:, -1], decay**size, block)  # (nb, M): y at each block's last step
    carry = torch.cat([ends.new_zeros(1, ends.shape[1]), ends[:-1]])  # (nb, M): y before each block
    growth = decay ** (j + 1)  # (B,)
    out = within + growth[None, :, None] * carry[:, None, :]
    return out.reshape(blocks * size, -1)[:steps].reshape(u.shape)


def ema(x: Tensor, alpha: float) -> Tensor:
    """Exponential moving average along dim 0 (pandas ``ewm(alpha=alpha, adjust=False)``)."""
    u = alpha * x
    u[0] = x[0]
    return linear_recurrence(u, 1.0 - alpha)


def rolling_mean(x: Tensor, window: int) -> Tensor:
    """Mean of the last ``window`` values along dim 0 (of all values so far in the first bars)."""
    total = torch.cumsum(x, dim=0)
    lagged = torch.cat([total.new_zeros(window, *x.shape[1:]), total[:-window]])[: x.shape[0]]
    count = torch.arange(1, x.shape[0] + 1, device=x.device, dtype=x.dtype).clamp(max=window)
    return (total - lagged) / count.view(-1, *([1] * (x.dim() - 1)))


def rolling_std(x: Tensor, window: int) -> Tensor:
    """Population standard deviation of the last ``window`` values along dim 0."""
    mean = rolling_mean(x, window)
    return (rolling_mean(x * x, window) - mean * mean).clamp(min=0.0).sqrt()


def lag(x: Tensor, bars: int) -> Tensor:
    """``x[t - bars]`` (``x[0]`` for the first bars)."""
    return torch.cat([x[:1].expand(bars, *x.shape[1:]), x[:-bars]])[: x.shape[0]]


def rsi(close: Tensor, window: int = 14) -> Tensor:
    """Wilder's relative strength index in [0, 100] (50 where prices have not moved)."""
    change = close - lag(close, 1)
    gain = ema(change.clamp(min=0.0), 1.0 / window)
    loss = ema((-change).clamp(min=0.0), 1.0 / window)
    total = gain + loss
    return torch.where(total > 0, 100.0 * gain / total.clamp(min=1e-300), torch.full_like(total, 50.0))


def macd(close: Tensor, fast: int = 12, slow: int = 26, signal: int = 9) -> tuple[Tensor, Tensor]:
    """``(macd_line, signal_line)``: EMA(fast) - EMA(slow) of the close, and its EMA(signal)."""
    line = ema(close.clone(), 2.0 / (fast + 1)) - ema(close.clone(), 2.0 / (slow + 1))
    return line, ema(line.clone(), 2.0 / (signal + 1))


def turbulence(log_returns: Tensor, window: int = 252, ridge: float = 1e-8) -> Tensor:
    """Kritzman-Li turbulence: ``(r_t - mu)' Sigma^-1 (r_t - mu)`` with mean and covariance of the
    ``window`` bars before ``t``; ``(T,)``, 0 for the first ``window`` bars. Under normal returns it
    follows a chi-squared law with S degrees of freedom (mean S). Memory: ``T * S * S`` floats."""
    steps, assets = log_returns.shape
    r = log_returns.to(torch.float64)
    out = torch.zeros(steps, dtype=torch.float64, device=r.device)
    if steps <= window:
        return out
    first = torch.cumsum(r, 0)  # (T, S)
    second = torch.cumsum(r[:, :, None] * r[:, None, :], 0)  # (T, S, S)
    # statistics of bars [t - window, t) for t = window .. T-1
    sum1 = first[window - 1 : -1] - torch.cat([first.new_zeros(1, assets), first[: steps - window - 1]])
    sum2 = second[window - 1 : -1] - torch.cat(
        [second.new_zeros(1, assets, assets), second[: steps - window - 1]]
    )
    mean = sum1 / window
    cov = sum2 / window - mean[:, :, None] * mean[:, None, :]
    scale = cov.diagonal(dim1=1, dim2=2).mean(1).clamp(min=1e-30)  # keep the ridge relative
    cov = cov + (ridge * scale)[:, None, None] * torch.eye(assets, dtype=cov.dtype, device=cov.device)
    deviation = r[window:] - mean  # (T - window, S)
    solved = torch.linalg.solve(cov, deviation.unsqueeze(-1)).squeeze(-1)
    out[window:] = (deviation * solved).sum(-1).clamp(min=0.0)
    return out


def trading_features(close: Tensor, volume: Tensor | None = None) -> Tensor:
    """``(T, S, 8)`` float32 features of ``(T, S)`` closes (and volumes), scale-free and clipped to
    [-5, 5], so that they need no statistics fitted on a training period:

    - ``ret1``: 1-bar log return / ``vol`` (``vol``: 20-bar standard deviation of 1-bar log returns);
    - ``ret5``: 5-bar log return / (``vol`` * sqrt 5);
    - ``ma10``, ``ma50``: log(close / moving average) / (``vol`` * sqrt window);
    - ``rsi14``: (RSI(14) - 50) / 50, in [-1, 1];
    - ``macd``: MACD(12, 26) line / (close * ``vol``);
    - ``vol20``: log(``vol`` / its exponential average over ~252 bars), the volatility regime;
    - ``volume20``: log((volume + 1) / (20-bar mean volume + 1)); zeros when there is no volume.
    """
    price = close.to(torch.float64)
    log_price = price.log()
    log_return = log_price - lag(log_price, 1)
    vol = rolling_std(log_return, 20).clamp(min=1e-6)
    features = [
        log_return / vol,
        (log_price - lag(log_price, 5)) / (vol * math.sqrt(5)),
        (log_price - rolling_mean(price, 10).log()) / (vol * math.sqrt(10)),
        (log_price - rolling_mean(price, 50).log()) / (vol * math.sqrt(50)),
        (rsi(price) - 50.0) / 50.0,
        macd(price)[0] / (price * vol),
        (vol / ema(vol.clone(), 1.0 / 252).clamp(min=1e-6)).log(),
    ]
    if volume is None:
        features.append(torch.zeros_like(price))
    else:
        amount = volume.to(torch.float64).clamp(min=0.0)
        features.append(((amount + 1.0) / (rolling_mean(amount, 20) + 1.0)).log())
    stacked = torch.stack(features, dim=-1).clamp(-FEATURE_CLIP, FEATURE_CLIP)
    return torch.nan_to_num(stacked, nan=0.0).to(torch.float32)
