-- pgstore 0017, downgrade: written by make revision from sql/; 0017_job_reschedule.py says what and why.

DROP FUNCTION job_reschedule(text, bigint, bigint);
