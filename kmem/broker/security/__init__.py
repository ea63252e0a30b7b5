"""Authentication as Kafka does it (KIP-43, KIP-84, KIP-152, KIP-255, KIP-768): the SASL mechanisms kmem broker
serves and what they check against. ``SaslSettings.from_settings`` reads Kafka's SASL settings for the served
listener; ``SaslMechanisms`` makes a mechanism server (``evaluate(token)``, ``complete``, ``username``) per
exchange, for the channel authenticator of ``kmem.network.sasl``."""
import dataclasses

from kmem.broker.log.config import INT32_MAX, integer
from kmem.broker.security.credentials import ScramCredentialStore, parse_add_scram
from kmem.broker.security.jaas import (parse_jaas_config, parse_jaas_file, plain_module_users, plain_users,
                                       server_context)
from kmem.broker.security.oauthbearer import LOGIN_MODULE as OAUTHBEARER_LOGIN_MODULE
from kmem.broker.security.oauthbearer import (OAUTHBEARER_SETTINGS, JwksSettings, JwksValidator, OAuthBearerServer,
                                                validator_settings)
from kmem.broker.security.plain import PlainServer
from kmem.broker.security.scram import MECHANISMS as SCRAM_MECHANISMS
from kmem.broker.security.scram import ScramCredential, ScramServer, credential_from_password
from kmem.errors import ConfigError

SERVED_MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS, "OAUTHBEARER")
# Kafka's defaults (BrokerSecurityConfigs, KafkaConfig)
DEFAULT_ENABLED_MECHANISMS = "GSSAPI"
DEFAULT_FAILED_AUTHENTICATION_DELAY_MS = 100
DEFAULT_MAX_RECEIVE_SIZE = 524288
DEFAULT_MAX_REAUTH_MS = 0       # connections.max.reauth.ms: no re-authentication asked of clients
# the settings read here; each may also carry the listener's prefix, listener.name.<name>.
SASL_SETTINGS = ("sasl.enabled.mechanisms", "sasl.jaas.config", "connection.failed.authentication.delay.ms",
                 "sasl.server.max.receive.size", "connections.max.reauth.ms", *OAUTHBEARER_SETTINGS)
# those that may also be given per mechanism, listener.name.<name>.<mechanism in lower case>.
MECHANISM_SETTINGS = ("sasl.jaas.config", "connections.max.reauth.ms", *OAUTHBEARER_SETTINGS)
# the JAAS file, a JVM system property for Kafka (-Djava.security.auth.login.config=FILE in KAFKA_OPTS): a setting
# of kmem broker (its --jaas option), read when no sasl.jaas.config setting applies
JAAS_FILE_SETTING = "java.security.auth.login.config"

__all__ = ["SERVED_MECHANISMS", "SaslSettings", "SaslMechanisms", "ScramCredentialStore", "ScramCredential",
           "ScramServer", "PlainServer", "credential_from_password", "parse_add_scram", "parse_jaas_config",
           "plain_users", "is_sasl_setting", "JAAS_FILE_SETTING"]


def is_sasl_setting(name):
    """True for a SASL setting, with or without a ``listener.name.<name>.`` (and, for the JAAS configuration and
    ``connections.max.reauth.ms`` and OAUTHBEARER's settings, a ``<mechanism>.``) prefix."""
    if name in SASL_SETTINGS or name == JAAS_FILE_SETTING:
        return True
    if not name.startswith("listener.name."):
        return False
    rest = name[len("listener.name."):].partition(".")[2]
    return rest in SASL_SETTINGS or rest.partition(".")[2] in MECHANISM_SETTINGS


@dataclasses.dataclass(frozen=True)
class SaslSettings:
    """The SASL settings of one listener."""
    enabled_mechanisms: tuple
    plain_users: dict = dataclasses.field(default_factory=dict, repr=False)     # passwords: never in a repr
    failed_authentication_delay_ms: int = DEFAULT_FAILED_AUTHENTICATION_DELAY_MS
    max_receive_size: int = DEFAULT_MAX_RECEIVE_SIZE
    max_reauth_ms: dict = dataclasses.field(default_factory=dict)       # mechanism -> connections.max.reauth.ms
    # OAUTHBEARER's validator: an UnsecuredValidator, or JwksSettings (KIP-768)
    oauthbearer: object = None

    @classmethod
    def from_settings(cls, merged, listener_name):
        """Read for listener ``listener_name``: ``listener.name.<name>.<setting>`` wins over ``<setting>`` (and for the
        JAAS configuration, ``connections.max.reauth.ms`` and OAUTHBEARER's settings,
        ``listener.name.<name>.<mechanism>.<setting>`` over both, as Kafka's ``SaslChannelBuilder`` reads them; and
        any JAAS configuration over the JAAS file's ``<name>.KafkaServer`` or ``KafkaServer`` context, as Kafka's
        ``JaasContext`` reads them). A
        mechanism kmem does not serve, Kafka's default GSSAPI included, is refused here, at start."""
        prefix = f"listener.name.{listener_name.lower()}."

        def setting(name, default=None):
            for key in (prefix + name, name):
                if key in merged:
                    return key, merged[key]
            return name, default

        key, value = setting("sasl.enabled.mechanisms", DEFAULT_ENABLED_MECHANISMS)
        enabled = tuple(m.strip() for m in str(value).split(",") if m.strip())
        unserved = [m for m in enabled if m not in SERVED_MECHANISMS]
        if unserved or not enabled:
            raise ConfigError(f"{key} = {value!r}: kmem broker serves the SASL mechanisms "
                              f"{', '.join(SERVED_MECHANISMS)}, not {', '.join(unserved) or 'none'}"
                              f"{' (Kafka default GSSAPI)' if key not in merged else ''}")
        jaas_file = merged.get(JAAS_FILE_SETTING)
        jaas_contexts = parse_jaas_file(jaas_file) if jaas_file else None      # a bad file is refused at start
        users = {}
        if "PLAIN" in enabled:
            jaas_key, jaas = prefix + "plain.sasl.jaas.config", merged.get(prefix + "plain.sasl.jaas.config")
            if jaas is None:
                jaas_key, jaas = setting("sasl.jaas.config")
            if jaas is not None:
                users = plain_users(jaas_key, jaas)
            elif jaas_contexts is not None:
                context, modules = server_context(jaas_file, jaas_contexts, listener_name)
                users = plain_module_users(f"JAAS file {jaas_file}, context {context}", modules)
            else:
                raise ConfigError(f"PLAIN is enabled on listener {listener_name}: set {prefix}plain.sasl.jaas.config "
                                  f"(PlainLoginModule required user_<name>=\"<password>\";) or give a JAAS file "
                                  "(--jaas) with a KafkaServer context")
        oauthbearer = None
        if "OAUTHBEARER" in enabled:
            def oauthbearer_setting(name, default=None):
                key = prefix + "oauthbearer." + name
                return (key, merged[key]) if key in merged else setting(name, default)
            jaas_key, jaas = oauthbearer_setting("sasl.jaas.config")
            if jaas is not None:
                modules = parse_jaas_config(jaas_key, jaas)
            elif jaas_contexts is not None:
                context, modules = server_context(jaas_file, jaas_contexts, listener_name)
                jaas_key = f"JAAS file {jaas_file}, context {context}"
            else:
                modules = []
            options = next((options for module, options in modules if module == OAUTHBEARER_LOGIN_MODULE), {})
            oauthbearer = validator_settings(oauthbearer_setting, (jaas_key, options))
        delay_key, delay = setting("connection.failed.authentication.delay.ms", DEFAULT_FAILED_AUTHENTICATION_DELAY_MS)
        size_key, size = setting("sasl.server.max.receive.size", DEFAULT_MAX_RECEIVE_SIZE)
        max_reauth_ms = {}
        for mechanism in enabled:
            per_mechanism = f"{prefix}{mechanism.lower()}.connections.max.reauth.ms"
            key, value = ((per_mechanism, merged[per_mechanism]) if per_mechanism in merged
                          else setting("connections.max.reauth.ms", DEFAULT_MAX_REAUTH_MS))
            max_reauth_ms[mechanism] = integer(key, value, 0)
        return cls(enabled, users, integer(delay_key, delay, 0, INT32_MAX), integer(size_key, size, 1, INT32_MAX),
                   max_reauth_ms, oauthbearer)


class SaslMechanisms:
    """The mechanism servers of a listener: ``enabled`` (in ``sasl.enabled.mechanisms``' order) and
    ``server(mechanism)``, a new exchange (None for a mechanism not enabled). KIP-768's validator reads its
    JWKS here (``ConfigError`` when it cannot) and refreshes it until ``close()``."""

    def __init__(self, settings, scram_credentials):
        self.enabled = list(settings.enabled_mechanisms)
        self._plain_users = settings.plain_users
        self._scram = scram_credentials
        oauthbearer = settings.oauthbearer
        self._oauthbearer = oauthbearer.start() if isinstance(oauthbearer, JwksSettings) else oauthbearer

    def close(self):
        """Stops the JWKS refresh of KIP-768's validator, if any."""
        if isinstance(self._oauthbearer, JwksValidator):
            self._oauthbearer.keys.close()

    def server(self, mechanism):
        if mechanism not in self.enabled:
            return None
        if mechanism == "PLAIN":
            return PlainServer(self._plain_users)
        if mechanism == "OAUTHBEARER":
            return OAuthBearerServer(self._oauthbearer)
        return ScramServer(mechanism, lambda user: self._scram.get(mechanism, user))
