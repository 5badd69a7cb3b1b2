-- 003_idempotency.sql - Idempotency-Key on admin writes: what the first request
-- with a key answered, so that a retry with the same key answers the same and
-- changes nothing (a retried top-up never counts twice).

-- One row per (admin, key). http_status is NULL while the first request is
-- still being served (or when its worker died before it could record the
-- answer: the outcome is then unknown and the key answers 409 for good).
CREATE TABLE IF NOT EXISTS admin_idempotency (
  admin_sub        VARCHAR(64)  NOT NULL COMMENT 'sub of the admin token (or the trusted user id)',
  idem_key         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                   COMMENT 'the Idempotency-Key header, quotes removed',
  request_method   VARCHAR(8)   NOT NULL,
  request_path     VARCHAR(255) NOT NULL,
  request_body     TEXT         NOT NULL COMMENT 'a key reused with another request is refused',
  http_status      SMALLINT     NULL     COMMENT 'NULL: not answered yet',
  response_headers VARCHAR(255) NOT NULL DEFAULT '',
  response_body    TEXT         NULL,
  created_at       DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (admin_sub, idem_key),
  KEY idx_admin_idempotency_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

INSERT IGNORE INTO schema_migration (version) VALUES ('003_idempotency');
