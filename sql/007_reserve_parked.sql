-- 007_reserve_parked.sql - what an operator's return kept out of stock
-- (DESIGN.md reserves rules 10 and 16). A return of a lost node's epoch
-- keeps the tokens the node may have granted (`parked`) out of the stock
-- until the node has replayed, or its journal is declared lost; then they
-- are released (`released_at`). A restore of a Redis that lost its data
-- keeps them out again: stock = total - coupons - queued - open amounts -
-- parked and not yet released.
ALTER TABLE reserve_epoch
  ADD COLUMN IF NOT EXISTS parked INT UNSIGNED NULL
    COMMENT 'an operator''s return: tokens kept out of stock for the node''s replay',
  ADD COLUMN IF NOT EXISTS released_at DATETIME(3) NULL
    COMMENT 'when the parked tokens went back (the node replayed, or its journal was declared lost)';

INSERT IGNORE INTO schema_migration (version) VALUES ('007_reserve_parked');
