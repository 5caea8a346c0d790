"""The job store: job records in Redis, submitting and cancelling jobs, datasets on S3."""
