-- Everything changefeed installs lives in this schema. It is owned by dbo so that the
-- generated procedures, the per-feed tables and the event tables of dbo-owned schemas share
-- one owner: ownership chaining then lets a reader that may only EXECUTE read_feed read
-- the tables read_feed touches, and nothing more.
create schema [changefeed] authorization [dbo];
