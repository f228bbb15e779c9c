"""Fleet traffic: a deterministic generator of agent fan-out messages, and its CLI hook.

The generator function is ``fanin.fleet.simulate.simulate``; it is deliberately not re-exported
here, so that ``fanin.fleet.simulate`` always names the module.
"""

from fanin.fleet.simulate import (
    CATEGORIES,
    CONTRACTS_PATH,
    DEAD_LETTER_ERRORS,
    FLAGS,
    MALFORMED,
    SHOWCASE_RATES,
    SimLine,
    SimRates,
    SimSummary,
    bundled_contracts,
    simulate_lines,
    write_simulation,
)

__all__ = [
    "CATEGORIES",
    "CONTRACTS_PATH",
    "DEAD_LETTER_ERRORS",
    "FLAGS",
    "MALFORMED",
    "SHOWCASE_RATES",
    "SimLine",
    "SimRates",
    "SimSummary",
    "bundled_contracts",
    "simulate_lines",
    "write_simulation",
]
