-- Adds an index to an outbox table unless one of that name is already there (a repair after
-- a partial install or a hand-made table). Internal: changefeed_setup_outbox calls it with
-- constant kinds and column lists, and accepts only those. The table name is checked again
-- here because the procedure can be called on its own and builds DDL from it.
create procedure changefeed_add_index(
    in p_table_name varchar(255),
    in p_index_name varchar(64),
    in p_kind varchar(16),
    in p_columns varchar(255)
)
    modifies sql data
    sql security invoker
begin
    call changefeed_check_table_name(p_table_name);
    -- Only the four indexes setup_outbox adds, so that no caller-made text reaches DDL.
    if (p_index_name, p_kind, p_columns) not in (
        ('message_id_unique', 'unique', 'message_id'),
        ('open_messages', '', 'is_open, id'),
        ('head_of_aggregate', '', 'aggregate_id, is_open, id'),
        ('done_by_processed_at', '', 'status, processed_at')
    ) then
        signal sqlstate '45000' set mysql_errno = 51009,
            message_text = 'changefeed_add_index: not one of the outbox indexes (internal).';
    end if;

    if not exists (
        select 1
        from information_schema.statistics
        where table_schema = database()
            and table_name = p_table_name
            and index_name = p_index_name
    ) then
        set @changefeed_ddl = concat(
            'alter table `', p_table_name, '` add ', p_kind, ' index `', p_index_name,
            '` (', p_columns, ')'
        );
        prepare changefeed_statement from @changefeed_ddl;
        execute changefeed_statement;
        deallocate prepare changefeed_statement;
    end if;
end
