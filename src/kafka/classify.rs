//! [`classify`]: what each librdkafka error means for the relay and the exporter.
//!
//! The table is on [`classify`] itself, so that it shows in the public documentation.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode as C;

use crate::relay::ErrorKind;

/// The kind of a produce failure.
///
/// The producer is idempotent with `acks=all` ([`ProducerSettings`](super::ProducerSettings)),
/// so librdkafka itself retries, in order and without duplicates, every produce failure it
/// knows to be passing. Those errors reach a delivery report only when the message's
/// `message.timeout.ms` runs out first, and then as `MessageTimedOut`. What does reach a
/// delivery report (or `send_result`) is judged by this table; the relay then acts on the
/// [`ErrorKind`] as its [failure table](crate::relay) says.
///
/// | librdkafka error (`RDKafkaErrorCode`) | kind | why |
/// |---|---|---|
/// | `NotLeaderForPartition`, `LeaderNotAvailable`, `RequestTimedOut`, `NetworkException`, `BrokerNotAvailable`, `ReplicaNotAvailable`, `NotEnoughReplicas`, `NotEnoughReplicasAfterAppend`, `KafkaStorageError`, `NotController`, `FencedLeaderEpoch`, `UnknownLeaderEpoch`, `OffsetNotAvailable`, `PreferredLeaderNotAvailable`, `EligibleLeadersNotAvailable`, `ElectionNotNeeded`, `RebootstrapRequired` | retried inside librdkafka; [`Retriable`](ErrorKind::Retriable) if one ever reaches us | leader changes, slow or restarting brokers: librdkafka refreshes its metadata and resends |
/// | `MessageTimedOut`, `BrokerTransportFailure`, `AllBrokersDown`, `Resolve`, `OperationTimedOut`, `TimedOutQueue`, `Retry`, `BrokerDestroy`, `DestroyBroker`, `Interrupted`, `UnknownBroker`, `WaitCache`, `InProgress`, `NodeUpdate`, `Partial`, `ISRInsufficient`, `DuplicateSequenceNumber`, `UnknownPartition`, and a cancelled delivery (the producer was dropped) | [`Retriable`](ErrorKind::Retriable) | the message was not delivered for a reason that passes (no broker reachable within the message timeout, the producer shutting down): publish it again after the retry policy's delay |
/// | `PurgeQueue`, `PurgeInflight` | [`Backpressure`](ErrorKind::Backpressure) | librdkafka purged the message unsent, as it does to every other queued message after a fatal producer error: the message is not at fault, so it is handed back without counting an attempt |
/// | `UnknownTopicOrPartition`, `UnknownTopic`, `UnknownTopicId` | [`Retriable`](ErrorKind::Retriable) | a topic that does not exist (yet) when auto-creation is off. Retried, not fatal: one row with a misspelt topic must not stop the relay for every other topic, and a topic being created appears within the retries; a topic that never appears makes its messages dead after `max_attempts` |
/// | `TopicAuthorizationFailed` | [`Retriable`](ErrorKind::Retriable) | one topic's ACL refuses the producer (Kafka with ACLs answers this for a misspelt topic too): that topic's problem, so its messages count attempts and go dead after `max_attempts` while other topics flow. [`KafkaPublisher`](super::KafkaPublisher) counts it so only when another topic accepted a message since the topic's previous refusal; otherwise it hands the message back without an attempt ([`Backpressure`](ErrorKind::Backpressure)), and makes it [`Fatal`](ErrorKind::Fatal) once the topic has refused for [`authorization_patience`](super::KafkaPublisherConfig::authorization_patience) with no other topic accepting a message: the producer lost write access everywhere; the exporter stops at once |
/// | `MessageSizeTooLarge` (from librdkafka's own `message.max.bytes` check at enqueue, or from the broker), `InvalidMessageSize`, `MessageBatchTooLarge` (Kafka's `RECORD_LIST_TOO_LARGE`), `InvalidMessage` (`CORRUPT_MESSAGE`), `InvalidRecord`, `BadMessage`, `BadCompression`, `InvalidTopic`, `PolicyViolation`, `KeySerialization`, `ValueSerialization`, `InvalidArgument`, a NUL byte in the topic | [`Poison`](ErrorKind::Poison) | this message can never be produced as it is; the rest of the batch can. A broker refuses a whole produce request (one partition's batch of messages) with `MessageSizeTooLarge`, `InvalidMessageSize`, `MessageBatchTooLarge`, `InvalidMessage` or `InvalidRecord`, so when one of these comes in a delivery report the message is only *suspect*: [`KafkaPublisher`](super::KafkaPublisher) and [`FeedExporter`](super::FeedExporter) produce it again alone (a request of one message) and judge it Poison only when it is refused on its own |
/// | `ClusterAuthorizationFailed`, `TransactionalIdAuthorizationFailed`, `GroupAuthorizationFailed`, `DelegationTokenAuthorizationFailed`, `SaslAuthenticationFailed`, `UnsupportedSASLMechanism`, `IllegalSASLState`, `Authentication`, `SSL`, `Fatal` (librdkafka's `_FATAL`: the idempotent producer lost its guarantee), `Fenced`, `ProducerFenced`, `InvalidProducerEpoch`, `InvalidProducerIdMapping`, `OutOfOrderSequenceNumber`, `UnknownProducerId`, `InvalidRequiredAcks`, `UnsupportedForMessageFormat`, `UnsupportedCompressionType`, `UnsupportedVersion`, `InvalidConfig`, `NotImplemented`, `UnsupportedFeature`, `NotConfigured`, `State`, `CriticalSystemResource`, `FileSystem`, and a configuration or client-creation error | [`Fatal`](ErrorKind::Fatal) | the producer cannot work at all (credentials, cluster ACLs, a fenced or failed producer, a broker or setting that cannot take these messages): every further message would fail the same way, so the relay hands the message back and stops |
/// | `InvalidTimestamp` | [`Backpressure`](ErrorKind::Backpressure) | the record's timestamp is the producing host's clock at produce time (no message sets one), and the topic's `message.timestamp.before.max.ms` / `after.max.ms` (`message.timestamp.difference.max.ms` before Kafka 3.6) refuse it: the clock is off, not the message, so it is handed back without counting an attempt. [`KafkaPublisher`](super::KafkaPublisher) makes it [`Fatal`](ErrorKind::Fatal), naming the clock and those settings, once a topic has refused for [`clock_patience`](super::KafkaPublisherConfig::clock_patience) with nothing delivered to it; the exporter stops at once |
/// | `QueueFull` | [`Backpressure`](ErrorKind::Backpressure) | librdkafka's local queue (`queue.buffering.max.messages` / `.kbytes`) is full: hand the message back without counting an attempt and claim later |
/// | `ThrottlingQuotaExceeded` | [`Backpressure`](ErrorKind::Backpressure) | the broker's quota: slow down |
/// | anything else (consumer-group, admin and transaction codes a producer is not sent, `Unknown`, codes newer than this table) | [`Retriable`](ErrorKind::Retriable) | an error we cannot place is retried, and goes dead after `max_attempts` like any retriable failure, so it neither stops the relay nor throws a message away on first sight |
///
/// ```
/// use changefeed::kafka::classify;
/// use changefeed::kafka::rdkafka::error::KafkaError;
/// use changefeed::kafka::rdkafka::types::RDKafkaErrorCode;
/// use changefeed::relay::ErrorKind;
///
/// let produce = |code| KafkaError::MessageProduction(code);
/// assert_eq!(classify(&produce(RDKafkaErrorCode::MessageTimedOut)), ErrorKind::Retriable);
/// assert_eq!(classify(&produce(RDKafkaErrorCode::MessageSizeTooLarge)), ErrorKind::Poison);
/// assert_eq!(
///     classify(&produce(RDKafkaErrorCode::ClusterAuthorizationFailed)),
///     ErrorKind::Fatal
/// );
/// assert_eq!(classify(&produce(RDKafkaErrorCode::QueueFull)), ErrorKind::Backpressure);
/// ```
pub fn classify(error: &KafkaError) -> ErrorKind {
    match error {
        // The delivery future's sender went away: the producer was dropped before the
        // report came, so the message may or may not be out. Publishing again is safe
        // (consumers drop duplicates by message-id).
        KafkaError::Canceled => ErrorKind::Retriable,
        // Settings librdkafka refuses: nothing will work until they are fixed.
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => ErrorKind::Fatal,
        // A NUL byte in the row's topic: that row can never be produced.
        KafkaError::Nul(_) => ErrorKind::Poison,
        other => match other.rdkafka_error_code() {
            Some(code) => classify_code(code),
            None => ErrorKind::Retriable,
        },
    }
}

/// Whether a delivery report's error is one a broker gives a whole produce request (one
/// partition's batch of messages), so that it does not say which message is at fault.
/// librdkafka's own `message.max.bytes` check refuses one message at enqueue instead, as
/// an error of `send_result`, never through a delivery report.
pub(crate) fn refuses_whole_request(error: &KafkaError) -> bool {
    error
        .rdkafka_error_code()
        .is_some_and(|code| WHOLE_REQUEST_REFUSALS.contains(&code))
}

/// The poison codes a broker answers for a whole produce request (see
/// [`refuses_whole_request`]); the table's other poison codes come with one message.
/// `InvalidTimestamp` is refused for a whole request too, but it is never a message's
/// fault (the timestamp is the producer's clock), so no message of it is suspect.
const WHOLE_REQUEST_REFUSALS: [C; 5] = [
    C::MessageSizeTooLarge,
    C::InvalidMessageSize,
    C::MessageBatchTooLarge,
    C::InvalidMessage,
    C::InvalidRecord,
];

/// Whether the broker refused the record's timestamp: the producing host's clock (or the
/// broker's) is off by more than the topic allows.
pub(crate) fn clock_refused(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(C::InvalidTimestamp)
}

/// Whether the error is a topic's authorization failure.
pub(crate) fn topic_refused(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(C::TopicAuthorizationFailed)
}

/// The table's rows, by error code.
fn classify_code(code: C) -> ErrorKind {
    if WHOLE_REQUEST_REFUSALS.contains(&code) {
        return ErrorKind::Poison;
    }
    match code {
        // Retried inside librdkafka; only a timed-out message would bring one here.
        C::NotLeaderForPartition
        | C::LeaderNotAvailable
        | C::RequestTimedOut
        | C::NetworkException
        | C::BrokerNotAvailable
        | C::ReplicaNotAvailable
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::KafkaStorageError
        | C::NotController
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::OffsetNotAvailable
        | C::PreferredLeaderNotAvailable
        | C::EligibleLeadersNotAvailable
        | C::ElectionNotNeeded
        | C::RebootstrapRequired => ErrorKind::Retriable,

        C::MessageTimedOut
        | C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::OperationTimedOut
        | C::TimedOutQueue
        | C::Retry
        | C::BrokerDestroy
        | C::DestroyBroker
        | C::Interrupted
        | C::UnknownBroker
        | C::WaitCache
        | C::InProgress
        | C::NodeUpdate
        | C::Partial
        | C::ISRInsufficient
        | C::DuplicateSequenceNumber
        | C::UnknownPartition => ErrorKind::Retriable,

        C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownTopicId => ErrorKind::Retriable,

        // One topic's ACL; the publisher decides from other topics' deliveries whether it
        // is that topic's own, not yet known (handed back) or producer-wide (fatal).
        C::TopicAuthorizationFailed => ErrorKind::Retriable,

        // Purged unsent (after a fatal producer error, or by our own time-out purge).
        C::PurgeQueue | C::PurgeInflight => ErrorKind::Backpressure,

        // And WHOLE_REQUEST_REFUSALS, above.
        C::BadMessage
        | C::BadCompression
        | C::InvalidTopic
        | C::PolicyViolation
        | C::KeySerialization
        | C::ValueSerialization
        | C::InvalidArgument => ErrorKind::Poison,

        C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::DelegationTokenAuthorizationFailed
        | C::SaslAuthenticationFailed
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        | C::Authentication
        | C::SSL
        | C::Fatal
        | C::Fenced
        | C::ProducerFenced
        | C::InvalidProducerEpoch
        | C::InvalidProducerIdMapping
        | C::OutOfOrderSequenceNumber
        | C::UnknownProducerId
        | C::InvalidRequiredAcks
        | C::UnsupportedForMessageFormat
        | C::UnsupportedCompressionType
        | C::UnsupportedVersion
        | C::InvalidConfig
        | C::NotImplemented
        | C::UnsupportedFeature
        | C::NotConfigured
        | C::State
        | C::CriticalSystemResource
        | C::FileSystem => ErrorKind::Fatal,

        C::QueueFull | C::ThrottlingQuotaExceeded => ErrorKind::Backpressure,

        // The producer's clock, not the message; the publisher decides when it is fatal.
        C::InvalidTimestamp => ErrorKind::Backpressure,

        _ => ErrorKind::Retriable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produce(code: C) -> ErrorKind {
        classify(&KafkaError::MessageProduction(code))
    }

    #[test]
    fn errors_librdkafka_retries_itself_are_retriable_if_they_surface() {
        for code in [
            C::NotLeaderForPartition,
            C::LeaderNotAvailable,
            C::RequestTimedOut,
            C::NetworkException,
            C::NotEnoughReplicas,
            C::KafkaStorageError,
        ] {
            assert_eq!(produce(code), ErrorKind::Retriable, "{code:?}");
        }
    }

    #[test]
    fn timeouts_transport_and_missing_topics_are_retriable() {
        for code in [
            C::MessageTimedOut,
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::Resolve,
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
        ] {
            assert_eq!(produce(code), ErrorKind::Retriable, "{code:?}");
        }
        assert_eq!(classify(&KafkaError::Canceled), ErrorKind::Retriable);
    }

    #[test]
    fn messages_that_can_never_be_produced_are_poison() {
        for code in [
            C::MessageSizeTooLarge,
            C::InvalidMessageSize,
            C::MessageBatchTooLarge,
            C::InvalidMessage,
            C::InvalidRecord,
            C::InvalidTopic,
            C::ValueSerialization,
        ] {
            assert_eq!(produce(code), ErrorKind::Poison, "{code:?}");
        }
        let nul = std::ffi::CString::new("a\0b").unwrap_err();
        assert_eq!(classify(&KafkaError::Nul(nul)), ErrorKind::Poison);
    }

    #[test]
    fn authorization_authentication_and_a_failed_producer_are_fatal() {
        for code in [
            C::ClusterAuthorizationFailed,
            C::SaslAuthenticationFailed,
            C::Authentication,
            C::SSL,
            C::Fatal,
            C::ProducerFenced,
            C::InvalidProducerEpoch,
            C::OutOfOrderSequenceNumber,
            C::UnsupportedForMessageFormat,
        ] {
            assert_eq!(produce(code), ErrorKind::Fatal, "{code:?}");
        }
        assert_eq!(
            classify(&KafkaError::ClientCreation("x".into())),
            ErrorKind::Fatal
        );
    }

    #[test]
    fn a_full_queue_a_quota_or_a_purge_is_backpressure() {
        assert_eq!(produce(C::QueueFull), ErrorKind::Backpressure);
        assert_eq!(produce(C::ThrottlingQuotaExceeded), ErrorKind::Backpressure);
        // After a fatal producer error librdkafka purges every other queued message: they
        // are handed back, no attempt counted.
        assert_eq!(produce(C::PurgeQueue), ErrorKind::Backpressure);
        assert_eq!(produce(C::PurgeInflight), ErrorKind::Backpressure);
    }

    #[test]
    fn one_topics_authorization_failure_is_that_topics_problem() {
        assert_eq!(produce(C::TopicAuthorizationFailed), ErrorKind::Retriable);
        assert!(topic_refused(&KafkaError::MessageProduction(
            C::TopicAuthorizationFailed
        )));
        assert!(!topic_refused(&KafkaError::MessageProduction(
            C::ClusterAuthorizationFailed
        )));
    }

    #[test]
    fn request_level_refusals_are_told_apart_from_a_single_messages() {
        for code in [
            C::MessageSizeTooLarge,
            C::MessageBatchTooLarge,
            C::InvalidMessage,
            C::InvalidRecord,
        ] {
            assert!(
                refuses_whole_request(&KafkaError::MessageProduction(code)),
                "{code:?}"
            );
        }
        for code in [
            C::InvalidTopic,
            C::ValueSerialization,
            C::MessageTimedOut,
            C::InvalidTimestamp,
        ] {
            assert!(
                !refuses_whole_request(&KafkaError::MessageProduction(code)),
                "{code:?}"
            );
        }
    }

    #[test]
    fn a_refused_timestamp_is_the_clocks_fault_not_the_messages() {
        let error = KafkaError::MessageProduction(C::InvalidTimestamp);
        assert_eq!(classify(&error), ErrorKind::Backpressure);
        assert!(clock_refused(&error));
        assert!(
            !refuses_whole_request(&error),
            "no message of it is suspect"
        );
        assert!(!clock_refused(&KafkaError::MessageProduction(
            C::InvalidRecord
        )));
    }

    #[test]
    fn codes_a_producer_is_not_sent_are_retriable() {
        for code in [C::Unknown, C::RebalanceInProgress, C::UnknownMemberId] {
            assert_eq!(produce(code), ErrorKind::Retriable, "{code:?}");
        }
        // The table judges the code, whatever operation reported it.
        assert_eq!(
            classify(&KafkaError::MetadataFetch(C::ClusterAuthorizationFailed)),
            ErrorKind::Fatal
        );
    }
}
