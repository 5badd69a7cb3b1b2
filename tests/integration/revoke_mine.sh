#!/usr/bin/env bash
# revoke_mine.sh - status?id of a revoked activity still tells a user
# whether a seize took (found by the nemesis, seed 59: users told
# UNKNOWN_OUTCOME before a revoke could not learn their outcome, as status
# left "mine" out and a repeated seize answers VOIDED; one of them held a
# live coupon, the revoke's MySQL half having failed).
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

cs_stack_up
ADMIN=$(mint_jwt 1 admin)
mk_activity 7000 100 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat" 200 "$HTTP_CODE"
http POST /market/consumer/coupon/seize '{"id":7000}' "$(mint_jwt 71)"
check_eq "user 71 seizes" SEIZED "$(json_get "$HTTP_BODY" code)"
http POST /market/admin/coupon/revoke '{"id":7000}' "$ADMIN"
check_eq "revoke" 200 "$HTTP_CODE"
http POST /market/consumer/coupon/seize '{"id":7000}' "$(mint_jwt 71)"
check_eq "a repeated seize answers VOIDED" VOIDED "$(json_get "$HTTP_BODY" code)"

http GET "/market/consumer/coupon/status?id=7000" '' "$(mint_jwt 71)"
check_eq "status of the revoked activity" VOIDED "$(jat "$HTTP_BODY" activity.status)"
check_eq "user 71: mine.seized" true "$(jat "$HTTP_BODY" mine.seized)"
http GET "/market/consumer/coupon/status?id=7000" '' "$(mint_jwt 72)"
check_eq "user 72: mine.seized" false "$(jat "$HTTP_BODY" mine.seized)"
http GET "/market/consumer/coupon/status?id=7000"
check_eq "without a token: no mine" "" "$(jat "$HTTP_BODY" mine)"
finish
