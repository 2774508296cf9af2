"""RocketMQ's ACL check (plain access validator, authentication part).

Every client request carries ``AccessKey``, ``Signature`` (and ``OnsChannel`` from the C++ client) in its
extFields; the C++ client computes the signature even with empty credentials. The signature is::

    Base64( HMAC-SHA1( secretKey, concat(values of all extFields except Signature, sorted by name) + body ) )

which we confirmed byte for byte against frames captured from the real client (numbers signed as their
decimal text). The check runs only when credentials are configured: with none, every request passes, as on
a broker with ``aclEnable=false``. Resource-level permissions (topic/group PUB/SUB) are not simulated.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from broker_sim.remoting.errors import AclError
from broker_sim.remoting.frame import RemotingCommand

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"


def signature(secret_key: str, ext_fields: Mapping[str, str], body: bytes = b"") -> str:
    content = "".join(ext_fields[k] for k in sorted(ext_fields) if k != SIGNATURE).encode("utf-8") + body
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(cmd: RemotingCommand, access_key: str, secret_key: str) -> RemotingCommand:
    """Add AccessKey and Signature to a request (what a client's RPC hook does before sending)."""
    cmd.ext_fields[ACCESS_KEY] = access_key
    cmd.ext_fields.pop(SIGNATURE, None)
    cmd.ext_fields[SIGNATURE] = signature(secret_key, cmd.ext_fields, cmd.body)
    return cmd


class AclGuard:
    """The server's request guard: known access key and a matching signature, or :class:`AclError`."""

    def __init__(self, accounts: Mapping[str, str]) -> None:
        if not accounts:
            raise ValueError("an ACL guard needs at least one access key")
        self.accounts = dict(accounts)

    def check(self, cmd: RemotingCommand) -> None:
        access_key = cmd.ext_fields.get(ACCESS_KEY)
        if not access_key:
            raise AclError("No accessKey is configured")
        secret = self.accounts.get(access_key)
        if secret is None:
            raise AclError(f"No acl config for {access_key}")
        given = cmd.ext_fields.get(SIGNATURE, "")
        if not hmac.compare_digest(given, signature(secret, cmd.ext_fields, cmd.body)):
            raise AclError(f"Check signature failed for accessKey={access_key}")


def parse_accounts(spec: str) -> dict[str, str]:
    """``"ak1:sk1,ak2:sk2"`` (the ``--acl`` option) → ``{ak: sk}``; ValueError when malformed."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        ak, sep, sk = item.partition(":")
        if not sep or not ak or not sk:
            raise ValueError(f"ACL account must be 'accessKey:secretKey', got {item!r}")
        out[ak] = sk
    return out
