-- One row per feed and shard: mode, committed outbox depth and its oldest time hint, head
-- ULID and its time, and when the shard last moved rows. Enough for a lag dashboard.
-- changefeed.refresh_feed_status rewrites this view whenever feeds come or go, as a union of
-- the per-feed status views; this first version (no feeds yet) has their columns and no rows.
create or alter view [changefeed].[feed_status]
as
select *
from [changefeed].[status:changefeed.__template__]
where 1 = 0;
