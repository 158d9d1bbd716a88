//! What `relay --brokers` and `export` share: the producer made from `--brokers` and `-X`,
//! and the check that a broker answers, done before the database is touched so that an
//! unreachable cluster is one line and exit status 2.

/// The line for `relay --brokers` or `export` in a build without Kafka.
#[cfg(not(feature = "kafka"))]
pub fn without_kafka(what: &str) -> crate::failure::Failure {
    crate::failure::Failure::usage(format!(
        "this changefeed was built without Kafka support; build it with --features \
         cli,kafka to {what}"
    ))
}

#[cfg(feature = "kafka")]
pub use with_kafka::*;

#[cfg(feature = "kafka")]
mod with_kafka {
    use changefeed::Error;
    use changefeed::kafka::rdkafka::producer::FutureProducer;
    use changefeed::kafka::{
        KafkaPublisher, KafkaPublisherConfig, ProducerSettings, check_brokers,
    };
    use changefeed::relay::RelayConfig;

    use crate::args::ProducerArgs;
    use crate::failure::Failure;

    /// The producer's settings: `brokers`, then every `-X` in order.
    pub fn settings(brokers: &str, args: &ProducerArgs) -> ProducerSettings {
        args.settings
            .iter()
            .fold(ProducerSettings::new(brokers), |settings, (key, value)| {
                settings.set(key.as_str(), value.as_str())
            })
    }

    /// Refuses `-X` settings under which a publish could outlive the relay's claim
    /// (`message.timeout.ms` too long, or 0), before anything connects: the rule
    /// `Relay::new` applies, checked on a publisher that is made here and dropped.
    pub fn check_publish_time(
        settings: &ProducerSettings,
        config: &RelayConfig,
    ) -> Result<(), Failure> {
        let publisher = KafkaPublisher::new(KafkaPublisherConfig::new(settings.clone()))
            .map_err(|error| setting_failure(&error))?;
        config
            .check_publisher(&publisher)
            .map_err(|error| setting_failure(&error))
    }

    /// Makes the producer and waits up to `--broker-timeout` for a broker to answer: a
    /// setting librdkafka refuses is a usage error, no answer a connection failure.
    pub async fn checked_producer(
        settings: &ProducerSettings,
        args: &ProducerArgs,
    ) -> Result<FutureProducer, Failure> {
        let producer = settings.create().map_err(|error| setting_failure(&error))?;
        check_brokers(&producer, args.broker_timeout.value)
            .await
            .map_err(|error| match error {
                Error::Config(_) => setting_failure(&error),
                other => Failure::connect(unreachable_message(
                    settings.brokers(),
                    &other,
                    &args.broker_timeout.to_string(),
                )),
            })?;
        Ok(producer)
    }

    /// A refused producer setting: the library's message names it, and usually says to
    /// fix the `-X` given.
    pub fn setting_failure(error: &Error) -> Failure {
        let error = error.to_string();
        if error.contains("-X") {
            Failure::usage(error)
        } else {
            Failure::usage(format!("{error} (check -X)"))
        }
    }

    /// The line for brokers that did not answer: which ones, and what to check (the
    /// library's message may already name the brokers and the option).
    pub fn unreachable_message(brokers: &str, error: &Error, timeout: &str) -> String {
        let error = error.to_string();
        let mut line = if error.contains(brokers) {
            error
        } else {
            format!("no Kafka broker of {brokers} answered: {error}")
        };
        if !line.contains("--brokers") {
            line.push_str("; check --brokers");
        }
        line.push_str(&format!(" (or raise --broker-timeout, now {timeout})"));
        line
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_unreachable_line_names_the_brokers_and_the_options_once() {
            let kafka = |message: &str| Error::Kafka {
                code: Some("AllBrokersDown".into()),
                message: message.into(),
            };
            assert_eq!(
                unreachable_message("127.0.0.1:1", &kafka("timed out"), "10s"),
                "no Kafka broker of 127.0.0.1:1 answered: Kafka: timed out; check --brokers \
                 (or raise --broker-timeout, now 10s)"
            );
            let named = kafka("no broker of 127.0.0.1:1 answered within 2s; check --brokers");
            assert_eq!(
                unreachable_message("127.0.0.1:1", &named, "2s"),
                "Kafka: no broker of 127.0.0.1:1 answered within 2s; check --brokers (or raise \
                 --broker-timeout, now 2s)"
            );
        }
    }
}

#[cfg(all(test, not(feature = "kafka")))]
mod tests {
    #[test]
    fn a_build_without_kafka_says_how_to_get_it() {
        let failure = super::without_kafka("export a feed to Kafka");
        let message = failure.message().unwrap_or_default();
        assert!(message.contains("--features cli,kafka"), "{message}");
        assert_eq!(failure.code(), 2);
    }
}
