-- mark_done for a claim-style outbox, written as the template outbox's procedure.
-- Fenced: only messages still processing under @claim_token become done, so a relay whose
-- claim expired and was taken over cannot acknowledge the new holder's work. Returns one
-- row, updated = how many changed. @ids is a JSON array of ids, e.g. N'[12, 13, 15]'.
create or alter procedure [changefeed].[mark_done:changefeed.__template_outbox__]
    @ids nvarchar(max),
    @claim_token uniqueidentifier
as
begin
    set nocount, xact_abort on;
    -- One statement, which commits on its own when the caller has no transaction. Under a
    -- caller's SET IMPLICIT_TRANSACTIONS ON it would open one and return with it open,
    -- holding the acknowledged rows locked: claim would hold back their aggregates until the client
    -- commits. Reverts on return. Inside a caller's transaction it joins that transaction.
    set implicit_transactions off;

    if @claim_token is null
        throw 51302, N'mark_done: @claim_token is null. Pass the claim_token that claim returned with these messages.', 1;
    if @ids is null or isjson(@ids) <> 1 or left(ltrim(@ids), 1) <> N'['
        throw 51302, N'mark_done: @ids must be a JSON array of message ids, e.g. N''[12, 13]''.', 1;

    update t
    set
        status = 2,
        processed_at = sysutcdatetime(),
        last_error = null
    from [changefeed].[__template_outbox__] as t
    inner join openjson(@ids) with (id bigint '$') as j
        on t.id = j.id
    where t.status = 1 and t.claim_token = @claim_token;

    select @@rowcount as updated;
end
