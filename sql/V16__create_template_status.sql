-- One row per shard of an outbox-mode feed, for changefeed.feed_status: how many committed
-- rows wait in the outbox and since when, the head of the feed and its time, and when the
-- shard last moved rows. Written as the template feed's view; upgrade_feed copies it.
-- The outbox is read with READPAST so a dashboard never waits for a writer: it counts
-- committed rows only.
-- lint: R16 accepted: READPAST keeps this dashboard view from ever waiting for a writer;
-- a caller inside a SNAPSHOT or SERIALIZABLE transaction may get error 650 from it, as
-- README ("Status views") says: query it outside such a transaction.
create or alter view [changefeed].[status:changefeed.__template__]
as
with shards as (
    select shard_id
    from [changefeed].[state:changefeed.__template__]
    union
    select shard_id
    from [changefeed].[outbox:changefeed.__template__] with (readcommittedlock, readpast, rowlock)
)

select
    convert(nvarchar(257), N'changefeed.__template__') as feed,
    convert(varchar(20), 'outbox') as mode,
    s.shard_id,
    pending.outbox_depth,
    pending.oldest_pending_at,
    head.head_ulid,
    changefeed.ulid_time(head.head_ulid) as head_at,
    st.updated_at as state_updated_at,
    st.purged_through
from shards as s
left outer join [changefeed].[state:changefeed.__template__] as st
    on s.shard_id = st.shard_id
outer apply (
    select
        count_big(*) as outbox_depth,
        min(o.time_hint) as oldest_pending_at
    from [changefeed].[outbox:changefeed.__template__] as o with (readcommittedlock, readpast, rowlock)
    where o.shard_id = s.shard_id
) as pending
outer apply (
    select max(f.ulid) as head_ulid
    from [changefeed].[feed:changefeed.__template__] as f
    where f.shard_id = s.shard_id
) as head;
