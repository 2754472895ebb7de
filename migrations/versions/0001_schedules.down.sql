-- pgstore 0001, downgrade: remove the schedule store.
DROP FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]);
DROP FUNCTION schedule_list();
DROP FUNCTION schedule_delete(text);
DROP FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint);
DROP FUNCTION schedule_renew(text, bigint, bigint);
DROP FUNCTION schedule_claim_due(text, text, bigint, bigint);
DROP FUNCTION schedule_register(text, text, text, bigint, bigint);
DROP FUNCTION schedule_get(text);
DROP TABLE schedule_fences;
DROP TABLE schedules;
DROP FUNCTION check_one_of(text, text, text[]);
DROP FUNCTION check_present(text, anyelement);
DROP FUNCTION check_positive(text, bigint);
DROP FUNCTION check_name(text, text);
DROP FUNCTION now_ms();
DROP FUNCTION schema_revision();
