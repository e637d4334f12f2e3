"""StockTrading-v0: accounting, the VecEnv contract, checkpoints, metrics, backtests and the CLI."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pandas", reason="the finance extra (pandas, pyarrow) is not installed")
pytest.importorskip("pyarrow", reason="the finance extra (pandas, pyarrow) is not installed")

import phalanx  # noqa: E402
from phalanx.backtesting import backtest  # noqa: E402
from phalanx.cli import main  # noqa: E402
from phalanx.envs.trading import StockTradingVecEnv  # noqa: E402
from phalanx.errors import DataError, EnvError  # noqa: E402
from phalanx.finance import metrics as m  # noqa: E402
from phalanx.finance.data import MarketData, load_sp500, load_sp500_index, synthetic_market  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def synthetic_env(num_envs=16, bars=400, stocks=3, **kwargs):
    kwargs.setdefault("episode_length", 50)
    return StockTradingVecEnv(num_envs, data=synthetic_market(stocks, bars, seed=2), **kwargs)


def hand_market(steps):
    """Two stocks: flat at 10 and 20 through the 50-bar warm-up, then the given closes."""
    closes = np.array([[10.0, 20.0]] * 50 + steps, dtype=np.float32)
    dates = np.array(np.arange(len(closes)), dtype="datetime64[D]").astype("datetime64[ns]")
    return MarketData(dates, ["AAA", "BBB"], closes, closes, closes, closes, source="<hand>", close_only=True)


def hand_env(steps, **kwargs):
    settings = dict(initial_cash=1000.0, transaction_cost=0.01, max_trade=0.5, reward_scaling=1.0)
    settings.update(kwargs)
    market = hand_market(steps)
    return StockTradingVecEnv(
        1, data=market, end=market.date(-1), random_start=False, episode_length=None, **settings
    )


# -- accounting -----------------------------------------------------------------------------------------
def test_hand_computed_steps_buy_capped_by_cash_and_sell_capped_by_holdings():
    env = hand_env([[10.0, 20.0], [11.0, 19.0], [12.0, 19.0], [12.0, 20.0]])
    obs, _ = env.reset(seed=0)
    assert env.episode_length == 3 and obs[0, 0] == 1.0  # all cash
    # step 1 at closes (10, 20), value 1000: buy 500 of AAA and 250 of BBB, 1% costs = 7.5
    _, reward, *_ = env.step(torch.tensor([[1.0, 0.5]]))
    torch.testing.assert_close(env.holdings[0], torch.tensor([50.0, 12.5], dtype=torch.float64))
    assert env.cash[0].item() == pytest.approx(242.5) and env.last_costs[0].item() == pytest.approx(7.5)
    value = 242.5 + 50 * 11 + 12.5 * 19  # marked at the next closes (11, 19): 1030
    assert reward[0].item() == pytest.approx(value - 1000.0) and env.last_value[0].item() == pytest.approx(
        value
    )
    # step 2 at (11, 19): buys of 515 each are scaled by one factor so that cash lands at exactly 0
    env.step(torch.tensor([[1.0, 1.0]]))
    scale = 242.5 / (1030.0 * 1.01)
    assert env.cash[0].item() == pytest.approx(0.0, abs=1e-9)
    torch.testing.assert_close(
        env.holdings[0], torch.tensor([50 + scale * 515 / 11, 12.5 + scale * 515 / 19], dtype=torch.float64)
    )
    # step 3 at (12, 19): selling half the portfolio value (~546) of BBB is capped by the BBB holdings (~362)
    holdings = env.holdings[0].clone()
    assert 0.5 * (holdings[0] * 12 + holdings[1] * 19) > holdings[1] * 19
    _, reward, _, truncated, _ = env.step(torch.tensor([[0.0, -1.0]]))
    proceeds = holdings[1].item() * 19 * 0.99
    assert (
        env.last_trades[0].tolist() == [0.0, pytest.approx(-holdings[1].item())] and env.holdings[0, 1] == 0
    )
    assert env.last_costs[0].item() == pytest.approx(holdings[1].item() * 19 * 0.01)
    assert env.last_value[0].item() == pytest.approx(proceeds + holdings[0].item() * 12)
    assert truncated[0]  # the whole period was one episode of 3 steps


def test_value_is_conserved_up_to_costs_and_nothing_goes_negative():
    env = synthetic_env(num_envs=64, transaction_cost=0.002, max_trade=0.5)
    env.reset(seed=1)
    generator = torch.Generator().manual_seed(0)
    extremes = [torch.ones(64, 3), -torch.ones(64, 3), torch.tensor([[1.0, -1.0, 1.0]]).expand(64, 3)]
    for step in range(150):
        if step % 10 < 3:
            actions = extremes[step % 10]
        else:
            actions = torch.rand(64, 3, generator=generator) * 4 - 2  # also outside [-1, 1]: clamped
        price = env.prices[env.bar]
        before = env.portfolio_value()
        env.step(actions)
        continuing = env.elapsed_steps > 0  # rows that did not just reset
        after_trade = env.cash + (env.holdings * price).sum(1)  # at the same closes the trade used
        torch.testing.assert_close(
            after_trade[continuing], (before - env.last_costs)[continuing], rtol=1e-12, atol=1e-6
        )
        expected_costs = 0.002 * (env.last_trades.abs() * price).sum(1)
        torch.testing.assert_close(env.last_costs, expected_costs)
        assert (env.cash >= 0).all() and (env.holdings >= 0).all()


def test_short_sales_and_leverage_respect_the_gross_exposure_cap():
    env = synthetic_env(
        num_envs=32, allow_short=True, max_leverage=2.0, max_trade=1.0, transaction_cost=0.001
    )
    env.reset(seed=0)
    saw_short = saw_borrow = False
    for step in range(60):
        actions = torch.rand(32, 3, generator=torch.Generator().manual_seed(step)) * 2 - 1
        price = env.prices[env.bar]
        gross_before = (env.holdings.abs() * price).sum(1)
        env.step(actions)
        continuing = env.elapsed_steps > 0
        gross = (env.holdings.abs() * price).sum(1)
        equity = env.cash + (env.holdings * price).sum(1)
        # new exposure only up to the cap; exposure past it through price moves is not force-closed
        within = (gross <= 2.0 * equity * (1 + 1e-9) + 1e-6) | (gross <= gross_before * (1 + 1e-12) + 1e-6)
        assert within[continuing].all()
        saw_short |= bool((env.holdings < 0).any())
        saw_borrow |= bool((env.cash < 0).any())
    assert saw_short and saw_borrow


def test_turbulence_liquidates_and_blocks_buying():
    env = synthetic_env(num_envs=8, turbulence_threshold=1e-12, turbulence_window=20)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (8, 2 + 3 * 10 + 1) and env.observation_names[-1] == "turbulence"
    for _ in range(5):
        env.step(torch.ones(8, 3))
        assert (env.holdings == 0).all() and (env.cash == env.initial_cash).all()
    calm = synthetic_env(num_envs=8, turbulence_threshold=1e12, turbulence_window=20)
    calm.reset(seed=0)
    calm.step(torch.ones(8, 3))
    assert (calm.holdings > 0).all()


def test_indicators_are_causal_and_match_pandas():
    import pandas as pd

    from phalanx.finance.indicators import ema, rsi, trading_features

    market = synthetic_market(3, 300, seed=4)
    close, volume = torch.as_tensor(market.close), torch.as_tensor(market.volume)
    full = trading_features(close, volume)
    for bar in (60, 150, 299):  # features at a bar do not change when later bars are removed
        torch.testing.assert_close(trading_features(close[: bar + 1], volume[: bar + 1])[bar], full[bar])
    x = close.double()
    reference = pd.DataFrame(x.numpy()).ewm(alpha=2 / 13, adjust=False).mean().to_numpy()
    np.testing.assert_allclose(ema(x.clone(), 2 / 13).numpy(), reference, rtol=1e-12)
    change = pd.DataFrame(x.numpy()).diff().fillna(0.0)
    gain = change.clip(lower=0).ewm(alpha=1 / 14, adjust=False).mean()
    loss = (-change).clip(lower=0).ewm(alpha=1 / 14, adjust=False).mean()
    np.testing.assert_allclose(rsi(x).numpy()[1:], (100 * gain / (gain + loss)).to_numpy()[1:], rtol=1e-10)


# -- the VecEnv contract --------------------------------------------------------------------------------
def test_check_vec_env_passes_on_synthetic_and_shipped_data():
    report = phalanx.check_vec_env(synthetic_env(num_envs=8, episode_length=30), num_steps=200)
    assert report.episodes >= 8 and report.mean_episode_length == 30 and not report.warnings
    report = phalanx.check_vec_env(phalanx.make_env("StockTrading-v0", num_envs=4), num_steps=300)
    assert report.episodes == 4 and report.mean_episode_length == 252


def test_make_env_default_data_4096_envs_and_random_starts():
    env = phalanx.make_env("StockTrading-v0", num_envs=4096, seed=0)
    obs, *_ = env.step(torch.zeros(4096, 20))
    assert obs.shape == (4096, 202) and obs.dtype == torch.float32 and torch.isfinite(obs).all()
    assert env.period == ("1990-03-14", "2017-12-29") and env.test_period == ("2018-01-02", "2022-12-28")
    assert env.tickers[0] == "AAPL" and env.observation_names[2:4] == ["AAPL.weight", "AAPL.log_price"]
    starts = env.start_bar
    assert starts.unique().numel() > 1000
    assert starts.min() >= env.first_bar and (starts + env.episode_length).max() <= env.last_bar
    assert env.market.date(int(env.last_bar)) == "2017-12-29"  # no bar of the test period is used


def test_state_dict_round_trip_continues_identically():
    env = synthetic_env(num_envs=8)
    env.reset(seed=3)
    for step in range(20):
        env.step(torch.rand(8, 3, generator=torch.Generator().manual_seed(step)) * 2 - 1)
    state = env.state_dict()
    actions = [torch.rand(8, 3, generator=torch.Generator().manual_seed(100 + k)) * 2 - 1 for k in range(40)]
    first = [env.step(a)[:2] for a in actions]
    other = synthetic_env(num_envs=8)
    other.load_state_dict(state)
    second = [other.step(a)[:2] for a in actions]
    for (obs_a, reward_a), (obs_b, reward_b) in zip(first, second, strict=True):
        torch.testing.assert_close(obs_a, obs_b, rtol=0, atol=0)
        torch.testing.assert_close(reward_a, reward_b, rtol=0, atol=0)


# -- bad input ------------------------------------------------------------------------------------------
def test_bad_env_input_names_file_ticker_and_dates():
    with pytest.raises(DataError, match=r"sp500_dataset.csv.gz: unknown ticker\(s\) TSLA"):
        StockTradingVecEnv(1, tickers=["AAPL", "TSLA"])
    with pytest.raises(
        DataError, match=r"the training period 2030-01-01..2031-01-01 has no bars; the data covers"
    ):
        StockTradingVecEnv(1, start="2030-01-01", end="2031-01-01")
    with pytest.raises(DataError, match=r"the test period 2025-01-01..end has no bars"):
        StockTradingVecEnv(1, test_start="2025-01-01")
    with pytest.raises(
        DataError, match=r"<synthetic seed=2>: too few bars .* after the 50-bar indicator warm-up"
    ):
        synthetic_env(bars=60, episode_length=20)
    with pytest.raises(
        DataError, match=r"<synthetic seed=0>: close price of T00\d on \d{4}-\d\d-\d\d is nan"
    ):
        StockTradingVecEnv(1, data=synthetic_market(3, 300, missing_fraction=0.05))
    with pytest.raises(EnvError, match=r"transaction_cost = 1.5 is invalid"):
        StockTradingVecEnv(1, transaction_cost=1.5)
    with pytest.raises(EnvError, match=r"max_leverage = 0.5 is invalid"):
        StockTradingVecEnv(1, max_leverage=0.5)


def test_bad_data_file_reaches_make_env(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("date,ticker,close\n2020-01-02,AAA,1\n2020-01-03,AAA,0\n")
    with pytest.raises(DataError, match=r"prices.csv: close price of AAA on 2020-01-03 is 0"):
        phalanx.make_env("StockTrading-v0", data=str(path))


# -- metrics --------------------------------------------------------------------------------------------
def test_metrics_against_hand_computed_values():
    equity = [100.0, 110.0, 99.0, 121.0]
    # simple returns 0.1, -0.1, 2/9; mean 2/27; sample variance (0.1-2/27)^2 + ... over 2
    returns = np.array([0.1, -0.1, 2 / 9])
    np.testing.assert_allclose(m.simple_returns(equity), returns)
    mean = 2 / 27
    std = math.sqrt(((0.1 - mean) ** 2 + (-0.1 - mean) ** 2 + (2 / 9 - mean) ** 2) / 2)
    assert m.cumulative_return(equity) == pytest.approx(0.21)
    assert m.annualized_return(equity, periods_per_year=3) == pytest.approx(0.21)  # 3 intervals = 1 year
    assert m.annualized_return(equity, periods_per_year=6) == pytest.approx(1.21**2 - 1)
    assert m.annualized_volatility(equity, periods_per_year=252) == pytest.approx(std * math.sqrt(252))
    assert m.sharpe_ratio(equity, periods_per_year=252) == pytest.approx(mean / std * math.sqrt(252))
    assert m.sharpe_ratio(equity, 252, risk_free=0.0252) == pytest.approx(
        (mean - 0.0001) / std * math.sqrt(252)
    )
    assert m.max_drawdown(equity) == pytest.approx(0.1)  # 110 -> 99
    assert m.calmar_ratio(equity, periods_per_year=3) == pytest.approx(2.1)
    summary = m.performance_summary(equity, 3)
    assert list(summary) == list(m.METRIC_NAMES) and summary["calmar_ratio"] == pytest.approx(2.1)
    assert m.max_drawdown([1.0, 2.0, 1.0, 0.5, 3.0]) == pytest.approx(0.75)


def test_metrics_edge_cases():
    flat = [5.0, 5.0, 5.0]
    assert math.isnan(m.sharpe_ratio(flat)) and math.isnan(m.calmar_ratio(flat))
    assert m.max_drawdown(flat) == 0 and m.annualized_volatility(flat) == 0
    ruined = [10.0, 5.0, 0.0, 0.0]
    assert m.annualized_return(ruined) == -1.0 and m.max_drawdown(ruined) == 1.0
    with pytest.raises(DataError, match="at least 2 values"):
        m.cumulative_return([1.0])
    with pytest.raises(DataError, match="must start above 0"):
        m.cumulative_return([0.0, 1.0])
    with pytest.raises(DataError, match=r"non-finite value nan at index 1"):
        m.max_drawdown([1.0, float("nan")])


# -- backtest: API, CLI, example --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trading") / "run"
    config = phalanx.make_config(
        "ppo",
        "StockTrading-v0",
        num_envs=8,
        total_steps=512,
        eval_every=0,
        eval_episodes=2,
        run_dir=str(run_dir),
        horizon=32,
        minibatch_size=128,
        hidden_sizes=(32, 32),
        torch_threads=1,
    )
    phalanx.train(config)
    return run_dir


def test_backtest_end_to_end(trained_run):
    result = backtest(trained_run)
    assert result.period == ("2018-01-02", "2022-12-28") and not result.in_sample
    assert list(result.metrics) == ["agent", "buy_and_hold", "index"]
    assert len(result.dates) == len(result.equity["agent"]) == 1257
    assert result.periods_per_year == pytest.approx(252, abs=0.5)
    # buy-and-hold and the index, recomputed from the raw data
    test = load_sp500(start="2018-01-01").close.astype(np.float64)
    shares = 1e6 / 20 / (test[0] * 1.001)
    np.testing.assert_allclose(result.equity["buy_and_hold"][1:], test[1:] @ shares, rtol=1e-9)
    index = load_sp500_index(start="2018-01-01").close[:, 0].astype(np.float64)
    np.testing.assert_allclose(result.equity["index"], 1e6 * index / index[0], rtol=1e-9)
    for name, curve in result.equity.items():
        assert curve[0] == 1e6
        assert result.metrics[name] == pytest.approx(m.performance_summary(curve, result.periods_per_year))
    out = trained_run / "backtest" / "2018-01-02_2022-12-28"
    assert result.out_dir == out and (out / "equity.png").stat().st_size > 10_000
    equity_rows = (out / "equity.csv").read_text().splitlines()
    assert equity_rows[0] == "date,agent,buy_and_hold,index" and len(equity_rows) == 1258
    trades = (out / "trades.csv").read_text().splitlines()
    assert trades[0] == "date,ticker,side,shares,price,value,cost" and len(trades) - 1 == result.num_trades
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["period"] == ["2018-01-02", "2022-12-28"] and set(saved["metrics"]) == set(result.metrics)
    text = result.format()
    assert "Sharpe ratio" in text and "buy & hold" in text and "max drawdown" in text


def test_backtest_periods_and_errors(trained_run):
    inside = backtest(trained_run, "2015-01-01", "2015-12-31", write=False)
    assert inside.period == ("2015-01-02", "2015-12-31") and inside.in_sample
    assert any("in-sample" in note for note in inside.notes)
    with pytest.raises(
        DataError, match=r"the backtest period 2030-01-01..2031-01-01 has no bars; the data covers"
    ):
        backtest(trained_run, "2030-01-01", "2031-01-01")
    with pytest.raises(DataError, match=r"too few bars"):
        backtest(trained_run, "2022-12-28", "2022-12-28")


def test_cli_backtest(trained_run, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")  # the folder written is printed whole, on one line
    assert main(["backtest", str(trained_run), "--start", "2019-01-01", "--end", "2019-12-31"]) == 0
    out = capsys.readouterr().out
    assert "Sharpe ratio" in out and "2019-01-02..2019-12-31" in out and "index" in out
    first = trained_run / "backtest" / "2019-01-02_2019-12-31"
    assert f"written: {first}\n" in out and (first / "metrics.json").is_file()
    # Another period gets its own folder; the same period again a new one beside the first, which stays.
    (first / "metrics.json").write_text("the first backtest")
    assert main(["backtest", str(trained_run), "--start", "2020-01-01", "--end", "2020-06-30"]) == 0
    assert f"written: {trained_run / 'backtest' / '2020-01-02_2020-06-30'}\n" in capsys.readouterr().out
    assert main(["backtest", str(trained_run), "--start", "2019-01-01", "--end", "2019-12-31"]) == 0
    again = first.with_name("2019-01-02_2019-12-31_2")
    assert f"written: {again}\n" in capsys.readouterr().out
    assert (first / "metrics.json").read_text() == "the first backtest"
    assert json.loads((again / "metrics.json").read_text())["period"] == ["2019-01-02", "2019-12-31"]
    assert main(["backtest", str(trained_run), "--start", "2030-01-01"]) == 2
    assert "the backtest period 2030-01-01" in capsys.readouterr().err
    assert main(["backtest", str(trained_run), "--start", "2019-12-31", "--end", "2019-01-01"]) == 2
    assert "ends before it starts" in " ".join(capsys.readouterr().err.split())
    assert main(["backtest", str(trained_run.parent / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_backtest_refuses_a_non_trading_run(tmp_path):
    config = phalanx.make_config(
        "ppo", "CartPole-v1", num_envs=4, total_steps=64, horizon=16, minibatch_size=32, eval_every=0,
        eval_episodes=1, run_dir=str(tmp_path / "cartpole"),
    )  # fmt: skip
    phalanx.train(config)
    with pytest.raises(EnvError, match=r"backtest needs a stock trading run: env 'CartPole-v1'"):
        backtest(tmp_path / "cartpole")


def test_presets_ship_for_ppo_and_sac():
    for algo in ("ppo", "sac"):
        config = phalanx.make_config(algo, "StockTrading-v0")
        config.validate()
        assert config.num_envs > 1


def test_example_trains_and_backtests(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["stock_trading.py"])
    module = runpy.run_path(str(ROOT / "examples" / "stock_trading.py"), run_name="example")
    result = module["main"](["--total-steps", "256", "--num-envs", "4", "--run-dir", str(tmp_path / "run")])
    assert set(result.metrics) == {"agent", "buy_and_hold", "index"}
    assert result.out_dir == tmp_path / "run" / "backtest" / "2018-01-02_2022-12-28"
    assert (result.out_dir / "equity.png").is_file()
