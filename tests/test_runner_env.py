"""Which NUMVAR_* variables a script realization inherits from the parent."""

from numvar.instrument.config import ENV_VARS
from numvar.runner import zygote


def test_instrument_vars_are_per_realization_and_others_pass():
    assert set(ENV_VARS) <= zygote.RUN_ENV_VARS  # the instrumentation's, all of them
    env = {"NUMVAR_MODE": "sr", "NUMVAR_SEED": "3", "NUMVAR_RUNNER": "{}",
           "NUMVAR_CACHE_DIR": "/c", "NUMVAR_ZYGOTE": "0", "PATH": "/bin"}
    assert zygote.inheritable_env(env) == {
        "NUMVAR_CACHE_DIR": "/c", "NUMVAR_ZYGOTE": "0", "PATH": "/bin"}
