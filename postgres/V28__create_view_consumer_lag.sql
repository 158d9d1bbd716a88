-- changefeed.consumer_lag: every saved cursor with its owner, the time it stands at, and how far
-- behind the shard's newest event it is (behind: the time between the two ULIDs). A consumer
-- that is far behind holds purge_feed back; remove a stale one with changefeed.remove_consumer.
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
    s.head_time - changefeed.ulid_time(c.cursor) as behind
from changefeed.consumer_cursor as c
join changefeed.feeds as f on f.feed_id = c.feed_id
left join changefeed.feed_status as s on s.feed = f.name and s.shard_id = c.shard_id;
