"""StockTrading-v0: a multi-stock trading VecEnv on real market data, all sub-envs as one batch.

``num_envs`` portfolios trade the same ``S`` stocks, each in its own episode of ``episode_length``
bars starting at a random bar of the training period (or, with ``random_start=False``, all from
its first bar: the backtest mode). Prices and indicators are computed once, at construction, as
device tensors; a step gathers each row's bar with one index and does the accounting for all rows
as tensor operations: no Python loop over envs or stocks, no host synchronisation.

Observation (float32, ``2 + S * 10`` values, names in :attr:`StockTradingVecEnv.observation_names`):

- ``cash_fraction``: cash / portfolio value; ``log_value``: log(portfolio value / initial cash);
- per stock, in ticker order, 10 values: ``weight`` (holdings x price / portfolio value),
  ``log_price`` (log of the close over the close at the episode's first bar), and the 8 features of
  :func:`phalanx.finance.indicators.trading_features` (returns, moving-average ratios, RSI, MACD,
  volatility, volume), which are scale-free and need no statistics fitted on the training period;
- with ``turbulence_threshold`` set, one more value: turbulence / threshold.

Action in ``[-1, 1]^S``: stock ``i`` trades ``a_i * max_trade * V`` worth of shares (``V``: the
portfolio value at the bar's close; positive buys, negative sells; fractional shares). Execution at
the close of the observed bar, in this order:

1. position-reducing parts first (sales of long holdings, purchases that cover shorts): a sale is
   capped by the holdings, so without ``allow_short`` holdings never go negative;
2. position-increasing parts (purchases, new shorts with ``allow_short``) are scaled down together,
   by one factor in [0, 1], so that the gross exposure ``sum |holdings x price|`` stays within
   ``max_leverage x V`` after costs. With the defaults (no shorting, ``max_leverage = 1``) this is
   "buys capped by the cash", shared pro rata between stocks: cash never goes negative. With
   leverage, exposure that grows past the cap through price moves is not force-closed (no margin
   calls); it only blocks new exposure.

Every traded value pays ``transaction_cost`` (proportional, on buys and sells). The reward is the
change of the portfolio value from this close to the next, costs included, times
``reward_scaling``. Episodes are truncated after ``episode_length`` steps; they terminate early only
when the portfolio value reaches 0 (possible only with leverage or shorting; no interest or borrow
fees are charged). With ``turbulence_threshold``, a bar whose turbulence index (Mahalanobis distance
of the bar's returns from the previous ``turbulence_window`` bars; about chi-squared with S degrees
of freedom in calm markets) exceeds the threshold liquidates every position and blocks new ones.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.core import BatchedVecEnv, Tensor
from phalanx.errors import DataError, EnvError
from phalanx.finance.data import (
    MarketData,
    align_to_dates,
    load_market_data,
    load_sp500,
    load_sp500_index,
)
from phalanx.finance.indicators import FEATURE_NAMES, WARMUP_BARS, trading_features, turbulence

logger = logging.getLogger("phalanx.finance")

DEFAULT_TRAIN_END = "2017-12-31"
"""The vendored S&P 500 data trains on 1990-2017 and is tested on 2018-2022."""


def _load(data: Any, tickers: Any, missing: str, fill_limit: int) -> Any:
    if data is None:
        market = load_sp500()
    elif isinstance(data, MarketData):
        market = data
    else:
        market = load_market_data(data, missing=missing, fill_limit=fill_limit)
    if tickers is not None:
        market = market.subset(list(tickers))
    bad = ~(market.close > 0)  # NaN (a missing bar left in a MarketData) or a non-positive price
    if bad.any():
        row, column = (int(v[0]) for v in np.nonzero(bad))
        raise DataError(
            f"{market.source}: close price of {market.tickers[column]} on {market.date(row)} is "
            f"{market.close[row, column]:g} ({int(bad.sum())} bad value(s)); the env needs a positive price "
            "for every ticker on every bar. Load the data with load_market_data (missing='ffill' or 'drop')."
        )
    return market


def _check_settings(name: str, settings: dict[str, Any]) -> None:
    """An :class:`EnvError` naming the first setting of ``name`` out of its range."""
    episode_length, threshold = settings["episode_length"], settings["turbulence_threshold"]
    for key, ok, expected in (
        ("initial_cash", settings["initial_cash"] > 0, "> 0"),
        ("transaction_cost", 0 <= settings["transaction_cost"] < 1, "in [0, 1), e.g. 0.001"),
        ("max_trade", settings["max_trade"] > 0, "> 0 (a fraction of the portfolio value, e.g. 0.1)"),
        ("reward_scaling", settings["reward_scaling"] > 0, "> 0"),
        ("max_leverage", settings["max_leverage"] >= 1, ">= 1 (1: no leverage)"),
        (
            "episode_length",
            episode_length is None or (isinstance(episode_length, int) and episode_length >= 1),
            "an integer >= 1, or None for the whole period",
        ),
        ("turbulence_threshold", threshold is None or threshold > 0, "> 0 or None"),
        ("turbulence_window", settings["turbulence_window"] >= 2, "an integer >= 2"),
    ):
        if not ok:
            raise EnvError(f"{name}: {key} = {settings[key]!r} is invalid: expected {expected}.")


def _observation_names(tickers: list[str], turbulence: bool) -> list[str]:
    """The names of the observation's values, in order (see the module docstring)."""
    names = ["cash_fraction", "log_value"]
    names += [
        f"{ticker}.{feature}" for ticker in tickers for feature in ("weight", "log_price", *FEATURE_NAMES)
    ]
    return names + ["turbulence"] if turbulence else names


class StockTradingVecEnv(BatchedVecEnv):
    """``num_envs`` portfolios trading ``S`` stocks on real prices; see the module docstring.

    Args:
        data: a CSV/Parquet path, a DataFrame or a :class:`~phalanx.finance.data.MarketData`; None for
            the vendored S&P 500 data set (20 stocks, daily, 1990-2022).
        tickers: the stocks to trade (default: all in the data).
        start, end: the period episodes are drawn from (inclusive dates). ``end`` defaults to
            2017-12-31 for the vendored data and to the bar at 80% of the data otherwise.
        test_start, test_end: the held-out period that ``phalanx backtest`` uses by default (default:
            from the bar after ``end`` to the last bar).
        index: a benchmark index (path, DataFrame or MarketData, first column) reported by backtests;
            default: the S&P 500 index for the vendored data, none otherwise.
        episode_length: steps per episode; None for one episode over the whole period.
        random_start: start each episode at a uniformly random bar (else at the period's first bar).
        initial_cash: cash at the start of each episode.
        transaction_cost: proportional cost of every traded value (0.001 = 10 basis points).
        max_trade: the largest trade per stock and step, as a fraction of the portfolio value.
        reward_scaling: the reward is the change of portfolio value times this.
        allow_short: allow negative holdings (short sales).
        max_leverage: cap on gross exposure / portfolio value (1: no leverage).
        turbulence_threshold: liquidate and stop buying on bars whose turbulence exceeds it (None: off).
        turbulence_window: bars of history of the turbulence index.
        missing, fill_limit: missing-bar handling when ``data`` is a file or frame (see
            :func:`~phalanx.finance.data.load_market_data`).
        dtype: the accounting dtype (float64 by default; float32 on MPS).
    """

    state_names = ("bar", "start_bar", "cash", "holdings")

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        data: Any = None,
        tickers: list[str] | None = None,
        start: Any = None,
        end: Any = None,
        test_start: Any = None,
        test_end: Any = None,
        index: Any = None,
        episode_length: int | None = 252,
        random_start: bool = True,
        initial_cash: float = 1_000_000.0,
        transaction_cost: float = 0.001,
        max_trade: float = 0.1,
        reward_scaling: float = 1e-4,
        allow_short: bool = False,
        max_leverage: float = 1.0,
        turbulence_threshold: float | None = None,
        turbulence_window: int = 252,
        missing: str = "ffill",
        fill_limit: int = 5,
        dtype: torch.dtype | None = None,
    ) -> None:
        settings = {
            "initial_cash": initial_cash,
            "transaction_cost": transaction_cost,
            "max_trade": max_trade,
            "reward_scaling": reward_scaling,
            "allow_short": allow_short,
            "max_leverage": max_leverage,
            "turbulence_threshold": turbulence_threshold,
            "turbulence_window": turbulence_window,
            "dtype": dtype,
        }
        _check_settings(type(self).__name__, {**settings, "episode_length": episode_length})
        market = _load(data, tickers, missing, fill_limit)
        self.market = market
        self.tickers = list(market.tickers)
        self.dates = market.dates  # (T,) datetime64[ns]
        vendored = data is None
        self.warmup = WARMUP_BARS + (turbulence_window + 1 if turbulence_threshold is not None else 0)
        self._choose_periods(start, end, test_start, test_end, episode_length, random_start, vendored)
        self.index_series = self._load_index(index, vendored)  # MarketData or None
        self.index_data = None  # (T,) index level on this env's calendar (NaN before it starts)
        if self.index_series is not None:
            self.index_data = align_to_dates(self.index_series, self.dates)

        self.initial_cash = float(initial_cash)
        self.transaction_cost = float(transaction_cost)
        self.max_trade = float(max_trade)
        self.reward_scaling = float(reward_scaling)
        self.allow_short = bool(allow_short)
        self.max_leverage = float(max_leverage)
        self.turbulence_threshold = turbulence_threshold
        self.turbulence_window = int(turbulence_window)
        self._settings = {"index": self.index_series, **settings}  # what backtest_env passes on

        self.observation_names = _observation_names(self.tickers, turbulence_threshold is not None)
        observation_space = gym.spaces.Box(-np.inf, np.inf, (len(self.observation_names),), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (len(self.tickers),), np.float32)
        super().__init__(num_envs, observation_space, action_space, device, self.episode_length)
        if dtype is None:
            dtype = torch.float32 if self.device.type == "mps" else torch.float64
        self.dtype = dtype
        self._compute_market_tensors()
        self._allocate_portfolios()

    # -- construction helpers ------------------------------------------------------------------------
    def _choose_periods(
        self,
        start: Any,
        end: Any,
        test_start: Any,
        test_end: Any,
        episode_length: int | None,
        random_start: bool,
        vendored: bool,
    ) -> None:
        """The training period's bars (after the indicator warm-up), the episode length, the last start
        bar and the held-out test period; a :class:`DataError` where the period is too short."""
        market, name = self.market, type(self).__name__
        if end is None:
            end = DEFAULT_TRAIN_END if vendored else market.date(max(0, int(0.8 * market.num_bars) - 1))
        first, last = market.index_range(start, end, what="training period")
        first_start = max(first, self.warmup)
        if first_start > first and start is not None:
            logger.info(
                "%s: episodes start at %s, after the %d-bar indicator warm-up",
                name,
                market.date(first_start),
                self.warmup,
            )
        available = last - first_start  # steps possible from the first usable bar
        length = available if episode_length is None else episode_length
        if available < 1 or length > available:
            raise DataError(
                f"{market.source}: too few bars for {name}: the period {market.date(first)}.."
                f"{market.date(last)} ({last - first + 1} bars) leaves {max(available, 0)} step(s) after "
                f"the {self.warmup}-bar indicator warm-up (from the data's first bar {market.date(0)}), but "
                f"episode_length={episode_length} needs {length if length >= 1 else 1}. Use more data (an "
                "earlier start or a later end), or a shorter episode_length."
            )
        self.first_bar, self.last_bar, self.episode_length = first_start, last, length
        self.last_start = last - length if random_start else first_start
        self.random_start = random_start
        # the held-out period, for backtests
        if test_start is None and last + 1 < market.num_bars:
            test_start = market.date(last + 1)
        self.test_period: tuple[str, str] | None = None
        if test_start is not None:
            test_first, test_last = market.index_range(test_start, test_end, what="test period")
            self.test_period = (market.date(test_first), market.date(test_last))

    def _compute_market_tensors(self) -> None:
        """Prices, log prices, features and turbulence on the device, computed once up to the training
        period's last bar (all causal)."""
        market, horizon = self.market, self.last_bar + 1
        close = torch.as_tensor(market.close[:horizon], device=self.device)
        volume = (
            None if market.volume is None else torch.as_tensor(market.volume[:horizon], device=self.device)
        )
        self.prices = close.to(self.dtype)  # (T, S)
        self.log_prices = close.to(torch.float64).log().to(torch.float32)  # (T, S)
        self.features = trading_features(close, volume)  # (T, S, F)
        self.turbulence: Tensor | None = None
        if self.turbulence_threshold is not None:
            log_returns = self.log_prices.to(torch.float64).diff(dim=0, prepend=self.log_prices[:1].double())
            self.turbulence = turbulence(log_returns, self.turbulence_window).to(torch.float32)  # (T,)

    def _allocate_portfolios(self) -> None:
        """Every row's portfolio (all cash, at the first bar) and what its last step did."""
        n, dtype = self.num_envs, self.dtype
        self.bar = torch.full((n,), self.first_bar, dtype=torch.int64, device=self.device)  # (N,)
        self.start_bar = self.bar.clone()  # (N,) first bar of each row's episode
        self.cash = torch.full((n,), self.initial_cash, dtype=dtype, device=self.device)  # (N,)
        self.holdings = torch.zeros(n, len(self.tickers), dtype=dtype, device=self.device)  # (N, S) shares
        self._price = self.prices.index_select(0, self.bar)  # (N, S) close at each row's bar
        # What the last step did, per row (read by backtests; not part of the checkpointed state).
        self.last_value = self.cash.clone()  # (N,) portfolio value after the step, at the next close
        self.last_trades = torch.zeros_like(self.holdings)  # (N, S) shares traded (+ buy, - sell)
        self.last_costs = torch.zeros_like(self.cash)  # (N,) transaction costs paid

    @staticmethod
    def _load_index(index: Any, vendored: bool) -> Any:
        if index is None:
            return load_sp500_index() if vendored else None
        return index if isinstance(index, MarketData) else load_market_data(index)

    def backtest_env(self, start: Any = None, end: Any = None, num_envs: int = 1) -> StockTradingVecEnv:
        """An env with this one's data and settings that runs one episode over ``start..end`` (default:
        the test period) from its first bar: the out-of-sample backtest."""
        if start is None and end is None:
            if self.test_period is None:
                raise DataError(
                    f"{self.market.source}: this env has no test period (its training period ends at the "
                    f"last bar, {self.market.date(-1)}). Pass start and end dates for the backtest."
                )
            start, end = self.test_period
        elif start is None:
            start = self.test_period[0] if self.test_period is not None else None
        if end is None:
            end = self.market.date(-1)
        self.market.index_range(start, end, what="backtest period")  # a clear error if outside the data
        return StockTradingVecEnv(
            num_envs=num_envs,
            device=self.device,
            data=self.market,
            start=start,
            end=end,
            episode_length=None,
            random_start=False,
            **self._settings,
        )

    @property
    def period(self) -> tuple[str, str]:
        """The first and last bar of the period episodes are drawn from (after the warm-up)."""
        return self.market.date(self.first_bar), self.market.date(self.last_bar)

    def __repr__(self) -> str:
        first, last = self.period
        return (
            f"StockTradingVecEnv(num_envs={self.num_envs}, {len(self.tickers)} stocks, {first}..{last}, "
            f"episode_length={self.episode_length}, device={self.device})"
        )

    # -- the simulator ---------------------------------------------------------------------------------
    def _reset_rows(self, mask: Tensor) -> None:
        if self.random_start:
            choices = self.last_start - self.first_bar + 1
            draw = (self.uniform(0.0, 1.0, (self.num_envs,)) * choices).long().clamp(max=choices - 1)
            fresh = self.first_bar + draw  # (N,)
        else:
            fresh = torch.full_like(self.bar, self.first_bar)
        self.bar = torch.where(mask, fresh, self.bar)
        self.start_bar = torch.where(mask, fresh, self.start_bar)
        self.cash = torch.where(mask, torch.full_like(self.cash, self.initial_cash), self.cash)
        self.holdings = torch.where(mask.unsqueeze(1), torch.zeros_like(self.holdings), self.holdings)
        self._price = self.prices.index_select(0, self.bar)

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        cost = self.transaction_cost
        price = self._price  # (N, S) close of the observed bar: trades execute there
        holdings, cash = self.holdings, self.cash
        value = cash + (holdings * price).sum(1)  # (N,)
        target = actions.to(self.dtype).clamp(-1.0, 1.0) * (self.max_trade * value.clamp(min=0.0)).unsqueeze(
            1
        )
        delta = target / price  # (N, S) shares wanted
        if self.turbulence is not None:
            assert self.turbulence_threshold is not None, "turbulence is computed for the threshold"
            turbulent = (self.turbulence.index_select(0, self.bar) > self.turbulence_threshold).unsqueeze(1)
            delta = torch.where(turbulent, -holdings, delta)  # close every position, open none

        # 1. position-reducing parts: sales of long holdings (capped by them), covers of shorts
        zero = torch.zeros_like(delta)
        reduce = torch.where(
            holdings > 0,
            torch.maximum(torch.minimum(delta, zero), -holdings),
            torch.minimum(torch.maximum(delta, zero), -holdings.clamp(max=0.0)),
        )
        increase = delta - reduce
        if not self.allow_short:
            increase = increase.clamp(min=0.0)
        cash = cash - (reduce * price).sum(1) - cost * (reduce.abs() * price).sum(1)
        holdings = holdings + reduce

        # 2. position-increasing parts, scaled by one factor so that gross exposure <= leverage * value
        added = (increase.abs() * price).sum(1)  # (N,) value of the new exposure wanted
        gross = (holdings.abs() * price).sum(1)
        equity = cash + (holdings * price).sum(1)
        room = self.max_leverage * equity - gross
        scale = (room / (added * (1.0 + self.max_leverage * cost)).clamp(min=1e-30)).clamp(0.0, 1.0)
        increase = increase * scale.unsqueeze(1)
        cash = cash - (increase * price).sum(1) - cost * (increase.abs() * price).sum(1)
        holdings = holdings + increase
        if not self.allow_short and self.max_leverage == 1.0:
            cash = cash.clamp(min=0.0)  # rounding only: the scale keeps cash >= 0 in exact arithmetic

        trades = reduce + increase
        self.last_trades = trades
        self.last_costs = cost * (trades.abs() * price).sum(1)
        self.cash, self.holdings = cash, holdings
        self.bar = self.bar + 1
        self._price = self.prices.index_select(0, self.bar)
        new_value = cash + (holdings * self._price).sum(1)  # marked at the next close
        self.last_value = new_value
        reward = ((new_value - value) * self.reward_scaling).to(torch.float32)
        terminated = new_value <= 0.0  # ruin; only possible with leverage or short sales
        return reward, terminated

    def _observe(self) -> Tensor:
        price = self._price  # (N, S)
        value = self.cash + (self.holdings * price).sum(1)  # (N,)
        floor = self.initial_cash * 1e-9
        denominator = value.clamp(min=floor).unsqueeze(1)
        cash_fraction = (self.cash.unsqueeze(1) / denominator).clamp(-10.0, 10.0)  # (N, 1)
        log_value = (value.clamp(min=floor) / self.initial_cash).log().unsqueeze(1)  # (N, 1)
        weight = (self.holdings * price / denominator).clamp(-10.0, 10.0)  # (N, S)
        log_price = self.log_prices.index_select(0, self.bar) - self.log_prices.index_select(
            0, self.start_bar
        )
        features = self.features.index_select(0, self.bar)  # (N, S, F)
        per_stock = torch.cat(
            [weight.to(torch.float32).unsqueeze(2), log_price.unsqueeze(2), features], dim=2
        )  # (N, S, 2 + F)
        parts = [cash_fraction.to(torch.float32), log_value.to(torch.float32), per_stock.flatten(1)]
        if self.turbulence is not None:
            assert self.turbulence_threshold is not None, "turbulence is computed for the threshold"
            parts.append((self.turbulence.index_select(0, self.bar) / self.turbulence_threshold).unsqueeze(1))
        return torch.cat(parts, dim=1)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._price = self.prices.index_select(0, self.bar)

    # -- reporting ---------------------------------------------------------------------------------------
    def portfolio_value(self) -> Tensor:
        """(N,) cash + holdings x close at each row's current bar."""
        return self.cash + (self.holdings * self._price).sum(1)

    @property
    def periods_per_year(self) -> float:
        """Bars per calendar year of the data (about 252 for daily bars)."""
        ints = self.dates.astype(np.int64)
        years = (ints[-1] - ints[0]) / (365.25 * 86_400e9)
        return float((len(ints) - 1) / years) if years > 0 else 252.0
