"""Read the credentials keyturn publishes in Vault from Python apps.

    from keyturn_client import Credential
    credential = Credential("apps/reporting/acme", client=hvac.Client(...))
    headers = {"Authorization": credential.authorization}

`keyturn_client.httpx.KeyturnAuth` and `keyturn_client.requests.KeyturnAuth` add the header
to every request and retry once with the new value when the service answers 401 or 403.
"""

from keyturn_client._credential import Credential, CredentialUnavailable

__all__ = ["Credential", "CredentialUnavailable"]
__version__ = "0.2.0"
