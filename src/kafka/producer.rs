//! [`ProducerSettings`]: the idempotent producer both Kafka jobs use, and [`check_brokers`].

use std::ffi::{CStr, c_char};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};

use crate::error::{Error, Result};

/// The settings [`ProducerSettings`] always makes, in this order, before any passthrough
/// setting.
const DEFAULTS: [(&str, &str); 2] = [("enable.idempotence", "true"), ("acks", "all")];

/// Settings for the producer: the brokers, then any librdkafka setting (`-X key=value` on the
/// command line). `enable.idempotence=true` and `acks=all` are set first; a setting that
/// would turn either off is refused, because without them a retried produce can duplicate
/// or reorder messages of one key.
///
/// ```
/// use changefeed::kafka::ProducerSettings;
///
/// let settings = ProducerSettings::new("kafka-1:9092,kafka-2:9092")
///     .set("compression.type", "lz4")
///     .set("linger.ms", "10");
/// let config = settings.client_config()?;
/// assert_eq!(config.get("bootstrap.servers"), Some("kafka-1:9092,kafka-2:9092"));
/// assert_eq!(config.get("enable.idempotence"), Some("true"));
/// assert_eq!(config.get("linger.ms"), Some("10"));
///
/// // Turning idempotence off is refused, naming the setting.
/// let error = ProducerSettings::new("kafka:9092")
///     .set("enable.idempotence", "false")
///     .client_config()
///     .unwrap_err();
/// assert!(error.to_string().contains("enable.idempotence"));
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerSettings {
    brokers: String,
    settings: Vec<(String, String)>,
}

impl ProducerSettings {
    /// The producer for `brokers` (`host:port[,host:port…]`, librdkafka's
    /// `bootstrap.servers`).
    pub fn new(brokers: impl Into<String>) -> Self {
        ProducerSettings {
            brokers: brokers.into(),
            settings: Vec::new(),
        }
    }

    /// Adds a librdkafka setting (a later one of the same key wins).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// The brokers, as given.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The value a passthrough setting gives `key` (the last one of that key), if any; the
    /// defaults above are not included.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.settings
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// How long librdkafka may hold a message before it fails it (`message.timeout.ms`, or
    /// its alias `delivery.timeout.ms`, whichever is given last): `Ok(None)` when neither is
    /// given, `Ok(Some(Duration::ZERO))` for 0, which librdkafka takes as no limit at all.
    pub fn message_timeout(&self) -> Result<Option<Duration>> {
        let Some((key, value)) = self
            .settings
            .iter()
            .rev()
            .find(|(key, _)| key == "message.timeout.ms" || key == "delivery.timeout.ms")
        else {
            return Ok(None);
        };
        let millis: u64 = value.trim().parse().map_err(|_| {
            Error::Config(format!(
                "the Kafka setting {key}={value} is not a whole number of milliseconds; give \
                 one (-X {key}=10000)"
            ))
        })?;
        Ok(Some(Duration::from_millis(millis)))
    }

    /// The librdkafka configuration: the defaults above, then every setting in order.
    /// A setting that turns idempotence or `acks=all` off is [`Error::Config`].
    pub fn client_config(&self) -> Result<ClientConfig> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in DEFAULTS {
            config.set(key, value);
        }
        for (key, value) in &self.settings {
            check_setting(key, value)?;
            config.set(key, value);
        }
        Ok(config)
    }

    /// Creates the producer; a setting librdkafka refuses is [`Error::Config`] naming it.
    pub fn create(&self) -> Result<FutureProducer> {
        self.client_config()?
            .create::<FutureProducer>()
            .map_err(|error| match error {
                KafkaError::ClientConfig(_, description, key, value) => Error::Config(format!(
                    "the Kafka setting {key}={value} is refused by librdkafka: {description}; \
                     fix or remove it (-X {key}=…)"
                )),
                other => Error::Config(format!(
                    "the Kafka producer for {} could not be created: {other}; check the -X \
                     settings it names",
                    self.brokers
                )),
            })
    }
}

/// Refuses a passthrough setting that would give up the guarantees the relay's per-key
/// order and exactly-once-per-attempt delivery rest on.
fn check_setting(key: &str, value: &str) -> Result<()> {
    let value = value.trim();
    match key {
        "enable.idempotence"
            if !matches!(value.to_ascii_lowercase().as_str(), "true" | "t" | "1") =>
        {
            Err(Error::Config(format!(
                "the Kafka setting enable.idempotence={value} is refused: without idempotence a \
                 retried produce can duplicate or reorder the messages of one key; remove it \
                 (the producer always sets enable.idempotence=true)"
            )))
        }
        "acks" | "request.required.acks" if !matches!(value, "all" | "-1") => {
            Err(Error::Config(format!(
                "the Kafka setting {key}={value} is refused: a message is acknowledged to the \
                 outbox only once every in-sync replica has it, which needs acks=all (or -1); \
                 remove it"
            )))
        }
        // librdkafka's `random` is the one partitioner that ignores the key; every other
        // (consistent, murmur2, fnv1a, and their `_random` forms, which are random only
        // for messages without a key) sends one key to one partition.
        "partitioner" if value.eq_ignore_ascii_case("random") => Err(Error::Config(format!(
            "the Kafka setting partitioner={value} is refused: it spreads one key over every \
             partition, so an aggregate's messages could be read out of order; remove it, or \
             use a partitioner that hashes the key (consistent_random, the default, or \
             murmur2_random to match the Java client) and the same one on every relay"
        ))),
        _ => Ok(()),
    }
}

/// Asks the brokers for their metadata within `timeout`: one clear [`Error::Kafka`] naming
/// the brokers when none answers, before any job starts.
///
/// ```no_run
/// # async fn f() -> changefeed::Result<()> {
/// use std::time::Duration;
/// use changefeed::kafka::{ProducerSettings, check_brokers};
///
/// let producer = ProducerSettings::new("kafka:9092").create()?;
/// check_brokers(&producer, Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub async fn check_brokers(producer: &FutureProducer, timeout: Duration) -> Result<()> {
    let producer = producer.clone();
    // fetch_metadata blocks its thread until the brokers answer or the timeout passes.
    let fetched = tokio::task::spawn_blocking(move || {
        let result = producer.client().fetch_metadata(None, timeout);
        (result.map(|_| ()), bootstrap_servers(&producer))
    })
    .await;
    let (result, brokers) = fetched.map_err(|join| Error::Kafka {
        code: None,
        message: format!("the broker check did not finish: {join}"),
    })?;
    result.map_err(|error| {
        let brokers = brokers.unwrap_or_else(|| "the configured brokers".to_owned());
        Error::Kafka {
            code: error.rdkafka_error_code().map(|code| format!("{code:?}")),
            message: format!(
                "no Kafka broker of {brokers} answered a metadata request within {timeout:?} \
                 ({error}); check --brokers and that the network reaches them"
            ),
        }
    })
}

/// The producer's `bootstrap.servers`, read back from librdkafka (the producer does not
/// keep its [`ProducerSettings`]), for error messages.
fn bootstrap_servers(producer: &FutureProducer) -> Option<String> {
    use rdkafka::bindings as rd;
    let mut buffer = [0u8; 1024];
    let mut size = buffer.len();
    // SAFETY: `rd_kafka_conf` returns the live handle's configuration, valid while the
    // producer (borrowed here) exists; `rd_kafka_conf_get` writes at most `size` bytes,
    // NUL-terminated, into the buffer and sets `size` to the length it needs.
    let code = unsafe {
        let conf = rd::rd_kafka_conf(producer.client().native_ptr());
        rd::rd_kafka_conf_get(
            conf,
            c"bootstrap.servers".as_ptr(),
            buffer.as_mut_ptr().cast::<c_char>(),
            &mut size,
        )
    };
    if code != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
        return None;
    }
    CStr::from_bytes_until_nul(&buffer)
        .ok()
        .map(|s| s.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_come_first_and_passthrough_settings_follow_in_order() {
        let settings = ProducerSettings::new("a:1,b:2")
            .set("linger.ms", "1")
            .set("linger.ms", "7")
            .set("acks", "-1");
        let config = settings.client_config().unwrap();
        assert_eq!(config.get("bootstrap.servers"), Some("a:1,b:2"));
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("-1"));
        assert_eq!(config.get("linger.ms"), Some("7"), "the later setting wins");
        assert_eq!(settings.get("linger.ms"), Some("7"));
        assert_eq!(settings.get("acks"), Some("-1"));
        assert_eq!(settings.get("enable.idempotence"), None);
    }

    #[test]
    fn settings_that_give_up_idempotence_or_acks_all_are_refused() {
        for (key, value) in [
            ("enable.idempotence", "false"),
            ("enable.idempotence", "0"),
            ("acks", "1"),
            ("acks", "0"),
            ("request.required.acks", "1"),
        ] {
            let error = ProducerSettings::new("k:9092")
                .set(key, value)
                .client_config()
                .expect_err(key);
            let text = error.to_string();
            assert!(matches!(error, Error::Config(_)), "{text}");
            assert!(text.contains(&format!("{key}={value}")), "{text}");
        }
        for (key, value) in [
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("request.required.acks", "-1"),
        ] {
            ProducerSettings::new("k:9092")
                .set(key, value)
                .client_config()
                .expect(key);
        }
    }

    #[test]
    fn a_partitioner_that_ignores_the_key_is_refused() {
        let error = ProducerSettings::new("k:9092")
            .set("partitioner", "random")
            .client_config()
            .expect_err("random spreads a key over partitions");
        let text = error.to_string();
        assert!(text.contains("partitioner=random"), "{text}");
        assert!(text.contains("out of order"), "{text}");
        for keeps_the_key in ["consistent_random", "murmur2_random", "fnv1a", "consistent"] {
            ProducerSettings::new("k:9092")
                .set("partitioner", keeps_the_key)
                .client_config()
                .expect(keeps_the_key);
        }
    }

    #[test]
    fn the_message_timeout_is_the_last_of_either_name() {
        assert_eq!(
            ProducerSettings::new("k:1").message_timeout().unwrap(),
            None
        );
        let settings = ProducerSettings::new("k:1")
            .set("message.timeout.ms", "5000")
            .set("delivery.timeout.ms", "7000");
        assert_eq!(
            settings.message_timeout().unwrap(),
            Some(Duration::from_secs(7))
        );
        let infinite = ProducerSettings::new("k:1").set("message.timeout.ms", "0");
        assert_eq!(infinite.message_timeout().unwrap(), Some(Duration::ZERO));
        let error = ProducerSettings::new("k:1")
            .set("delivery.timeout.ms", "ten")
            .message_timeout()
            .unwrap_err();
        assert!(
            error.to_string().contains("delivery.timeout.ms=ten"),
            "{error}"
        );
    }

    #[test]
    fn a_setting_librdkafka_refuses_is_a_config_error_naming_it() {
        let error = ProducerSettings::new("k:9092")
            .set("no.such.setting", "1")
            .create()
            .err()
            .expect("an unknown setting is refused");
        let text = error.to_string();
        assert!(matches!(error, Error::Config(_)), "{text}");
        assert!(text.contains("no.such.setting"), "{text}");
    }

    #[tokio::test]
    async fn check_brokers_names_the_brokers_when_none_answers() {
        // Port 1 on localhost: refused at once, so the check fails within its timeout.
        let producer = ProducerSettings::new("127.0.0.1:1").create().unwrap();
        let error = check_brokers(&producer, Duration::from_millis(300))
            .await
            .expect_err("nothing listens on port 1");
        let text = error.to_string();
        assert!(matches!(error, Error::Kafka { .. }), "{text}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert!(text.contains("--brokers"), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");
    }

    #[tokio::test]
    async fn check_brokers_passes_against_a_mock_cluster() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let producer = ProducerSettings::new(cluster.bootstrap_servers())
            .create()
            .unwrap();
        check_brokers(&producer, Duration::from_secs(5))
            .await
            .expect("the mock broker answers");
    }
}
