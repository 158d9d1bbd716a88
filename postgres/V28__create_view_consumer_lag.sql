-- changefeed.consumer_lag: every saved cursor with its owner, the time it stands at, how far
-- behind the shard's newest event it is (behind: the time between the two ULIDs), and
-- holds_retention: whether its consumer is registered (changefeed.register_consumer), so that
-- its cursor holds purge_feed back. A registered consumer that is far behind holds the purge
-- back; remove a stale one with changefeed.remove_consumer. An unregistered one does not: the
-- purge deletes past its cursor and names it in passed_consumers.
create view changefeed.consumer_lag as
select
    c.consumer,
    f.name as feed,
    c.shard_id,
    c.owner,
    c.cursor,
    changefeed.ulid_time(c.cursor) as cursor_time,
    c.updated_at,
    s.head_ulid,
    s.head_time - changefeed.ulid_time(c.cursor) as behind,
    exists (
        select 1 from changefeed.registered_consumers as r
        where r.feed_id = c.feed_id and r.consumer = c.consumer
    ) as holds_retention
from changefeed.consumer_cursor as c
join changefeed.feeds as f on f.feed_id = c.feed_id
left join changefeed.feed_status as s on s.feed = f.name and s.shard_id = c.shard_id;
