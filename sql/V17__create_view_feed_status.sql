-- One row per feed and shard: mode, committed outbox depth and its oldest time hint, head
-- ULID and its time, when the shard last moved rows, its low-water mark, and problem: NULL
-- for a working feed. A feed that cannot be shown (its event table was dropped or replaced,
-- or its status view is missing) has one row instead, with a NULL shard and, in problem,
-- what is wrong and the statement that fixes it. Enough for a lag dashboard.
-- changefeed.refresh_feed_status rewrites this view whenever feeds come or go, as a union of
-- the per-feed status views; this first version (no feeds yet) has their columns and no rows.
-- The status views read with READPAST, which SQL Server allows at READ COMMITTED and
-- REPEATABLE READ; inside a SNAPSHOT or SERIALIZABLE transaction it can refuse them (error
-- 650), and a view cannot set its own isolation level. Query this view (and consumer_lag)
-- at READ COMMITTED, the default. See README, "Status views".
create or alter view [changefeed].[feed_status]
as
select
    t.*,
    convert(nvarchar(1000), null) as problem
from [changefeed].[status:changefeed.__template__] as t
where 1 = 0;
