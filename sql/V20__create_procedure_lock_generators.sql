-- Serializes the procedures that create, regenerate or drop per-feed and per-outbox objects
-- (setup_feed, upgrade_feed, teardown_feed, setup_outbox, upgrade_outbox). Each rebuilds
-- changefeed.feed_status from the registry: two of them running at once could each miss the
-- other's uncommitted registry row (and under locking reads deadlock on it). Call it inside
-- the transaction; the lock is held until that transaction ends. A nested call by the same
-- transaction is granted at once.
create or alter procedure [changefeed].[lock_generators]
as
begin
    set nocount, xact_abort on;

    declare @lock_result int;

    if @@trancount = 0
        throw 51009, N'lock_generators must be called inside the generator''s transaction.', 1;

    exec @lock_result = sys.sp_getapplock
        @Resource = N'changefeed:generators',
        @LockMode = 'Exclusive',
        @LockOwner = 'Transaction',
        @LockTimeout = 60000;
    if @lock_result < 0
        throw 51012, N'Another setup_feed, upgrade or teardown held the changefeed generators for over 60 s (or this call was a deadlock victim). Retry when it has finished.', 1;
end
