/* scripts.h - the Lua scripts of lua/, as C strings made by make from the
 * files (lib/scripts.c, see Makefile.am: lines that begin with "--" are left
 * out), and what each answers. Each file's header says its KEYS, ARGV and
 * answers; lua/seize.lua is also installed and read at start-up
 * (fcgi.script), so an operator can read what runs. */
#ifndef CS_SCRIPTS_H
#define CS_SCRIPTS_H

extern const char script_seize[];
extern const char script_seize_batch[];
extern const char script_activity_list_cas[];
extern const char script_preheat_publish[];
extern const char script_coupon_return[];
extern const char script_reconcile[];
extern const char script_restore[];
extern const char script_lock_renew[];
extern const char script_lock_release[];
extern const char script_keeper_claim[];
extern const char script_reserve_set_aside[];
extern const char script_reserve_renew[];
extern const char script_reserve_replay[];
extern const char script_reserve_give_back[];
extern const char script_reserve_release[];

/* Every script by its file's name without ".lua", for the tests that load
 * each one alone. */
struct script_text {
    const char *name;
    const char *text;
};
extern const struct script_text script_all[];
extern const int script_count;

#endif
