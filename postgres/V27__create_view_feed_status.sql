-- changefeed.feed_status: one row per feed and shard (see changefeed.feed_status_rows).
create view changefeed.feed_status as
select * from changefeed.feed_status_rows();
