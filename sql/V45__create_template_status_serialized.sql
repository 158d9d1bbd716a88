-- One row per shard of a serialized-writer feed, for changefeed.feed_status, with the same
-- columns as the outbox-mode status view so that feed_status can union them: there is
-- no outbox, so its depth and oldest time are null. Written as the template feed's view.
-- READPAST: a dashboard must not wait for a writer's open transaction.
-- lint: R16 accepted: READPAST keeps this dashboard view from ever waiting for a writer;
-- a caller inside a SNAPSHOT or SERIALIZABLE transaction may get error 650 from it, as
-- README ("Status views") says: query it outside such a transaction.
create or alter view [changefeed].[status:changefeed.__template_serialized__]
as
select
    convert(nvarchar(257), N'changefeed.__template_serialized__') as feed,
    convert(varchar(20), 'serialize_writers') as mode,
    st.shard_id,
    convert(bigint, null) as outbox_depth,
    convert(datetime2(3), null) as oldest_pending_at,
    head.head_ulid,
    changefeed.ulid_time(head.head_ulid) as head_at,
    st.updated_at as state_updated_at,
    st.purged_through
from [changefeed].[state:changefeed.__template_serialized__] as st
    with (readcommittedlock, readpast, rowlock)
outer apply (
    select max(e.__template_ulid__) as head_ulid
    from [changefeed].[__template_serialized__] as e with (readcommittedlock, readpast, rowlock)
    where e.__template_shard__ = st.shard_id
) as head;
