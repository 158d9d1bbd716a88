-- The template feed. Its per-feed procedures and views (the next files) are written once, as
-- real objects of this feed, so that every static gate parses them and SQL Server compiles
-- them at migration time. changefeed.upgrade_feed copies their definitions for each real feed,
-- replacing the marked names:
--   [changefeed].[__template__]                the event table
--   changefeed.__template__                    the 'schema.table' inside per-feed names
--   e.__template_key__ = r.__template_key__    the join of the event table on its key
--   __template_key__                           the list of key columns
-- It is not registered in changefeed.feeds and gets no roles.
create table [changefeed].[__template__] (
    __template_key__ bigint not null,
    payload nvarchar(200) null,
    constraint template_pk primary key clustered (__template_key__)
);

declare @template_id int = object_id(N'[changefeed].[__template__]', N'U');

exec changefeed.create_feed_storage @object_id = @template_id;
