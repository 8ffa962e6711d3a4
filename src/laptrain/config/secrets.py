"""Credentials kept out of what laptrain writes (the trackers' copy of the config,
``tracking.json``, the resume command, the lock file): the resolved config goes to
``hparams.yaml``, MLflow and W&B, so a value whose key is named like a credential becomes
:data:`MASK`, and a URI loses its ``user:password@``."""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# a key named like a credential: password, secret, api_key, hf_token, ...; not pad_token or
# text_key, which name a token or a column
SECRET_NAME = re.compile(
    r"(^|_)(password|passwd|secret|credentials?)(_|$)"
    r"|^(token|key)$|(^|_)(api|access|auth|hf|hub|github|private|bearer|refresh|session|tracking)"
    r"_?(token|key)$",
    re.IGNORECASE,
)
URI_LOGIN = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)


def secret_name(key: str) -> bool:
    """Whether a config key's last part (``model.hf_token`` -> ``hf_token``) names a credential."""
    return bool(SECRET_NAME.search(key.rsplit(".", 1)[-1].lstrip("+~")))


def without_login(text: str) -> str:
    """``text`` with the ``user:password@`` of each URI in it replaced by ``***@``."""
    return URI_LOGIN.sub(rf"\1{MASK}@", text)


def masked(value: Any) -> Any:
    """A copy of a config container with credentials and URI logins masked."""
    if isinstance(value, dict):
        return {
            k: MASK if secret_name(str(k)) and value[k] not in (None, "") else masked(value[k])
            for k in value
        }
    if isinstance(value, list | tuple):
        return [masked(v) for v in value]
    return without_login(value) if isinstance(value, str) else value


def masked_argument(argument: str) -> str:
    """An argument or override with its credential masked: ``+model.hf_token=***``."""
    key, equals, value = argument.partition("=")
    if equals and value and secret_name(key):
        return f"{key}={MASK}"
    return without_login(argument)
