/* bindings/kiln.c: the kiln launcher.
   Embeds LuaJIT, puts the kiln Lua library on package.path, loads it into the global
   `kiln`, then runs -e chunks, a script or the REPL (lua/kiln/repl.lua), like `luajit`. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#include <kiln/error.h>
#include <kiln/system.h>
#include <kiln/dist.h>

#define HISTORY_MAX_LINES 1000

static const char *progname = "kiln";

static void print_usage(FILE *f)
{
  fprintf(f,
          "usage: %s [options] [script [args...]]\n"
          "       %s launch -n N [--hosts h1,h2] script [args...]   (a distributed job: docs/distributed.md)\n"
          "       %s nb run|sweep|convert FILE ...  (notebooks: %s nb --help)\n"
          "  -e code        run code (may be repeated)\n"
          "  -l name        require library name into the global name\n"
          "  -i             enter the REPL after running the script and -e code\n"
          "  -v, --version  print the version\n"
          "  -h, --help     print this help\n"
          "  --             stop handling options\n"
          "  -              run the script read from stdin\n"
          "With no script and no -e: the REPL when stdin is a terminal, else stdin runs as a script.\n"
          "Environment: KILN_LUA_PATH (';'-separated directories searched first for Lua modules),\n"
          "             KILN_HISTORY (the REPL history file, default ~/.kiln_history).\n",
          progname, progname, progname, progname);
}

/* ---- running chunks: error reports with a traceback, and Ctrl-C as a Lua error ---- */

/* The state whose hook the SIGINT handler sets (one interpreter per process). */
static lua_State *global_L;

/* Ctrl-C while Lua runs: the interrupt is pending until it reaches the top (docall's message
   handler or the REPL's, which calls kiln.readline.interrupt_caught(), runs for it; docall
   returns; or the REPL reads its next line). Until then the hook raises "interrupted" at every
   call, return and instruction, so that a pcall in the running code cannot swallow it: the next
   instruction after that pcall raises it again. (Hooks do not run inside error handlers.) */
static volatile sig_atomic_t interrupt_pending;
/* 1 once the hook has raised the interrupt in the running docall (its error is the interrupt's) */
static volatile sig_atomic_t interrupt_raised;
enum { INTERRUPT_MASK = LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT };

/* A time limit (kiln nb run --timeout): 1 while armed, 2 once it has fired and the hook is set.
   When the hook has not fired TIMEOUT_GRACE seconds later (a JIT-compiled loop), kiln ends with
   status 124, as timeout(1) does. */
static volatile sig_atomic_t timeout_stage;
enum { TIMEOUT_GRACE = 2 };

static void interrupt_done(lua_State *L)
{
  interrupt_pending = 0;
  timeout_stage = 0;
  alarm(0);
  lua_sethook(L, NULL, 0, 0);
}

/* Runs at the next call, return or instruction after a SIGINT: raises in the interrupted code. */
static void interrupt_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  alarm(0);
  if (!interrupt_pending) {
    lua_sethook(L, NULL, 0, 0);
    return;
  }
  interrupt_raised = 1;
  /* the message alone, wherever it lands (luaL_error would prefix a library file's line when
     the interrupt falls in kiln's own code): the traceback says where the user's code was */
  lua_pushstring(L, timeout_stage == 2 ? "timed out" : "interrupted");
  lua_error(L);
}

/* 1 while the REPL runs: a prompt can come back, so a second Ctrl-C does not end kiln. */
static int repl_mode;

/* SIGINT while Lua runs. Only a hook can be set safely from a signal handler. In a script, a
   second Ctrl-C before the interrupt is through gets the default action and ends the process, as
   in lua.c; in the REPL it sets the hook again (the REPL compiles what is typed with the JIT off,
   so a loop typed there sees the hook). JIT-compiled loops never call hooks, so an alarm says so
   if the hook has not fired soon. */
static void on_sigint_eval(int sig)
{
  if (!repl_mode)
    signal(sig, SIG_DFL);
  timeout_stage = 0;   /* Ctrl-C takes over from a time limit */
  interrupt_pending = 1;
  lua_sethook(global_L, interrupt_hook, INTERRUPT_MASK, 1);
  alarm(1);
}

static void on_interrupt_slow(int sig)
{
  (void)sig;
  if (timeout_stage == 1) {   /* the time limit: interrupt as Ctrl-C does, then wait for the hook */
    timeout_stage = 2;
    interrupt_pending = 1;
    lua_sethook(global_L, interrupt_hook, INTERRUPT_MASK, 1);
    alarm(TIMEOUT_GRACE);
    return;
  }
  if (timeout_stage == 2) {
    static const char late[] = "\nkiln: timed out, and a JIT-compiled loop does not see it: kiln ends here\n";
    ssize_t n = write(STDERR_FILENO, late, sizeof late - 1);
    (void)n;
    _exit(124);
  }
  static const char msg[] =
    "\nkiln: still running (a JIT-compiled loop does not see Ctrl-C); press Ctrl-C again to quit kiln\n";
  static const char msg_repl[] =
    "\nkiln: still running (a JIT-compiled loop in a library does not see Ctrl-C); Ctrl-\\ quits kiln\n";
  ssize_t n = repl_mode ? write(STDERR_FILENO, msg_repl, sizeof msg_repl - 1)
                        : write(STDERR_FILENO, msg, sizeof msg - 1);  /* async-signal-safe, unlike stdio */
  (void)n;
}

static void install_signal_handlers(void)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_interrupt_slow;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
}

static void install_eval_sigint(void)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint_eval;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

/* A frame of kiln's own Lua library (in the source tree or installed), which a traceback leaves
   out: the user's frames are what tell where their code went wrong. */
static int is_library_frame(const char *line, size_t len)
{
  static const char *marks[] = {"/lua/kiln/", "/lua/5.1/kiln/", "/share/lua/5.1/kiln/"};
  for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++) {
    size_t ml = strlen(marks[m]);
    for (size_t i = 0; i + ml <= len; i++)
      if (memcmp(line + i, marks[m], ml) == 0)
        return 1;
  }
  return 0;
}

static int is_c_frame(const char *line, size_t len)
{
  size_t i = 0;
  while (i < len && (line[i] == ' ' || line[i] == '\t'))
    i++;
  return len - i >= 4 && memcmp(line + i, "[C]:", 4) == 0;
}

/* The traceback on top of the stack without kiln's library frames, the C functions they called
   (error, pcall) and the launcher's own frame at the bottom; no "stack traceback:" when nothing
   is left. */
static void filter_traceback(lua_State *L)
{
  size_t len;
  const char *tb = lua_tolstring(L, -1, &len);
  const char *head = strstr(tb, "\nstack traceback:\n");
  if (tb == NULL || head == NULL)
    return;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addlstring(&b, tb, (size_t)(head - tb));
  const char *p = head + strlen("\nstack traceback:\n");
  const char *end = tb + len;
  int kept = 0;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *line_end = nl ? nl : end;
    size_t ll = (size_t)(line_end - p);
    const char *next = nl ? nl + 1 : end;
    const char *next_end = next < end ? memchr(next, '\n', (size_t)(end - next)) : NULL;
    size_t nll = next < end ? (size_t)((next_end ? next_end : end) - next) : 0;
    int drop = is_library_frame(p, ll) || (is_c_frame(p, ll) && nll > 0 && is_library_frame(next, nll)) ||
               (is_c_frame(p, ll) && next >= end);
    if (!drop) {
      luaL_addstring(&b, kept ? "\n" : "\nstack traceback:\n");
      luaL_addlstring(&b, p, ll);
      kept++;
    }
    p = next;
  }
  luaL_pushresult(&b);
  lua_remove(L, -2);
}

/* Message handler of docall: the message (or what __tostring makes of a non-string error)
   followed by a traceback of the user's frames. */
static int message_handler(lua_State *L)
{
  interrupt_done(L);   /* an interrupt has reached the top */
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      msg = lua_tostring(L, -1);
    else
      msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  filter_traceback(L);
  return 1;
}

/* lua_pcall with the message handler and Ctrl-C turned into a Lua error. */
static int docall(lua_State *L, int narg, int nres)
{
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, message_handler);
  lua_insert(L, base);
  interrupt_raised = 0;
  install_eval_sigint();
  int status = lua_pcall(L, narg, nres, base);
  signal(SIGINT, SIG_DFL);
  interrupt_done(L);
  lua_remove(L, base);
  return status;
}

/* Prints the error on top of the stack as "kiln: <message>" and pops it; returns status. */
static int report(lua_State *L, int status)
{
  if (status != 0 && !lua_isnil(L, -1)) {
    const char *msg = lua_tostring(L, -1);
    if (msg == NULL)
      msg = "(error object is not a string)";
    fprintf(stderr, "%s: %s\n", progname, msg);
    fflush(stderr);
    lua_pop(L, 1);
  }
  return status;
}

/* ---- package.path ---- */

/* Appends "<dir>/?.lua;<dir>/?/init.lua;" to the buffer. */
static void add_lua_dir(luaL_Buffer *b, const char *dir, size_t len)
{
  if (len == 0)
    return;
  luaL_addlstring(b, dir, len);
  luaL_addstring(b, "/?.lua;");
  luaL_addlstring(b, dir, len);
  luaL_addstring(b, "/?/init.lua;");
}

/* The directory holding this executable ("" when unknown), for an installed kiln. */
static void executable_dir(char *out, size_t size)
{
  out[0] = '\0';
  ssize_t n = readlink("/proc/self/exe", out, size - 1);
  if (n <= 0)
    return;
  out[n] = '\0';
  char *slash = strrchr(out, '/');
  if (slash != NULL)
    *slash = '\0';
  else
    out[0] = '\0';
}

/* Prepends, in order: $KILN_LUA_PATH dirs, the source tree's lua/ and the source tree
   itself (for `require "models.mlp"`), then the installed share/lua/5.1 directories. An
   installed kiln (a share/lua/5.1/kiln next to its bin/) skips the source tree: it runs the
   library it was installed with, wherever it was built. */
static void set_package_path(lua_State *L)
{
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  const char *env = getenv("KILN_LUA_PATH");
  while (env != NULL && *env != '\0') {
    const char *end = strchr(env, ';');
    size_t len = end ? (size_t)(end - env) : strlen(env);
    add_lua_dir(&b, env, len);
    env = end ? end + 1 : NULL;
  }
  char exe_dir[PATH_MAX];
  executable_dir(exe_dir, sizeof exe_dir);
  char installed[PATH_MAX + 64];
  snprintf(installed, sizeof installed, "%s/../share/lua/5.1/kiln/init.lua", exe_dir);
  if (exe_dir[0] == '\0' || access(installed, R_OK) != 0) {
    add_lua_dir(&b, KILN_SOURCE_DIR "/lua", strlen(KILN_SOURCE_DIR "/lua"));
    add_lua_dir(&b, KILN_SOURCE_DIR, strlen(KILN_SOURCE_DIR));
  }
  if (exe_dir[0] != '\0') {
    luaL_addstring(&b, exe_dir);
    luaL_addstring(&b, "/../share/lua/5.1/?.lua;");
    luaL_addstring(&b, exe_dir);
    luaL_addstring(&b, "/../share/lua/5.1/?/init.lua;");
  }
  add_lua_dir(&b, KILN_INSTALL_LUA_DIR, strlen(KILN_INSTALL_LUA_DIR));
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  luaL_addvalue(&b);  /* the default path last */
  luaL_pushresult(&b);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
}

/* ---- the kiln.readline module: line editing, history and completion for repl.lua ---- */

static char history_path[PATH_MAX];
static int history_loaded;
static int history_added;    /* entries added since the last save */
static int history_warned;

/* $KILN_HISTORY, else ~/.kiln_history, else none (empty path). */
static void history_locate(void)
{
  const char *env = getenv("KILN_HISTORY");
  const char *home = getenv("HOME");
  if (env != NULL && *env != '\0')
    snprintf(history_path, sizeof history_path, "%s", env);
  else if (home != NULL && *home != '\0')
    snprintf(history_path, sizeof history_path, "%s/.kiln_history", home);
  else
    history_path[0] = '\0';
}

/* Writes the new entries; 0 or an errno. Appends when the file exists so that two
   sessions do not overwrite each other. */
static int history_save(void)
{
  if (!history_loaded || history_added == 0 || history_path[0] == '\0')
    return 0;
  int n = history_added < history_length ? history_added : history_length;
  int rc = access(history_path, F_OK) == 0 ? append_history(n, history_path) : write_history(history_path);
  history_added = 0;
  return rc;
}

/* Saves, and says once per session when the file cannot be written (HOME read-only). */
static void history_save_or_warn(void)
{
  int rc = history_save();
  if (rc != 0 && !history_warned) {
    history_warned = 1;
    fprintf(stderr, "%s: could not save the history to %s: %s\n", progname, history_path, strerror(rc));
  }
}

/* atexit (os.exit() in the REPL included): trims the file to the last lines. */
static void history_close(void)
{
  history_save_or_warn();
  if (history_path[0] != '\0' && access(history_path, W_OK) == 0)
    history_truncate_file(history_path, HISTORY_MAX_LINES);
}

static void history_load(void)
{
  if (history_loaded)
    return;
  history_loaded = 1;
  history_locate();
  using_history();
  stifle_history(HISTORY_MAX_LINES);
  if (history_path[0] != '\0')
    read_history(history_path);  /* a missing or unreadable file is an empty history */
  atexit(history_close);
}

/* kiln.readline.save_history() -> true | nil, message */
static int lrl_save_history(lua_State *L)
{
  int rc = history_save();
  if (rc == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  history_warned = 1;
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", history_path, strerror(rc));
  return 2;
}

/* kiln.readline.add_history(line): skips blank lines and repeats of the last entry.
   Each line goes to the file at once, so that a crash or a kill keeps the history. */
static int lrl_add_history(lua_State *L)
{
  const char *line = luaL_checkstring(L, 1);
  history_load();
  if (line[strspn(line, " \t\r\n")] == '\0')
    return 0;
  HIST_ENTRY *last = history_length > 0 ? history_get(history_base + history_length - 1) : NULL;
  if (last != NULL && strcmp(last->line, line) == 0)
    return 0;
  add_history(line);
  history_added++;
  history_save_or_warn();
  return 0;
}

/* Completion: readline asks kiln.repl.complete(text, line_before_cursor) for candidates. */
static lua_State *completion_L;
static char **candidates;
static size_t candidate_count, candidate_next;

static void candidates_clear(void)
{
  for (size_t i = 0; i < candidate_count; i++)
    free(candidates[i]);
  free(candidates);
  candidates = NULL;
  candidate_count = candidate_next = 0;
}

/* Copies the strings of the table on top of the stack into `candidates`. */
static void candidates_take(lua_State *L)
{
  size_t n = lua_objlen(L, -1);
  candidates = calloc(n + 1, sizeof *candidates);
  if (candidates == NULL)
    return;
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, (int)i);
    const char *s = lua_tostring(L, -1);
    if (s != NULL && (candidates[candidate_count] = strdup(s)) != NULL)
      candidate_count++;
    lua_pop(L, 1);
  }
}

/* Calls the Lua completer under pcall; an error in it means no candidates. */
static void candidates_fetch(lua_State *L, const char *text, int end)
{
  int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "kiln.repl");
  if (lua_pcall(L, 1, 1, 0) == 0 && lua_istable(L, -1)) {
    lua_getfield(L, -1, "complete");
    lua_pushstring(L, text);
    lua_pushlstring(L, rl_line_buffer, (size_t)end);
    if (lua_pcall(L, 2, 1, 0) == 0 && lua_istable(L, -1))
      candidates_take(L);
  }
  lua_settop(L, top);
}

static char *candidate_generator(const char *text, int state)
{
  (void)text;
  if (state == 0)
    candidate_next = 0;
  if (candidate_next < candidate_count)
    return strdup(candidates[candidate_next++]);
  return NULL;
}

static char **attempt_completion(const char *text, int start, int end)
{
  (void)start;
  rl_attempted_completion_over = 1;      /* never fall back to file names */
  rl_completion_append_character = '\0'; /* "kiln.rand" may go on with "n" or "(" */
  candidates_clear();
  if (completion_L == NULL)
    return NULL;
  candidates_fetch(completion_L, text, end);
  if (candidate_count == 0)
    return NULL;
  return rl_completion_matches(text, candidate_generator);
}

/* Ctrl-C at the prompt: readline's own handler cleans up the terminal and passes the
   signal on to this one; the event hook then ends readline() so the line is dropped. */
static volatile sig_atomic_t prompt_interrupted;

static void on_sigint_prompt(int sig)
{
  (void)sig;
  prompt_interrupted = 1;
}

static int prompt_event_hook(void)
{
  if (prompt_interrupted) {
    rl_replace_line("", 0);
    rl_done = 1;
  }
  return 0;
}

/* '.' and ':' are not word breaks, so that the whole "kiln.ra" or "t:vi" is completed. */
static char word_breaks[] = " \t\n\"\\'`@$><=;|&{}()[],+-*/%^~#";

static void readline_setup(void)
{
  static int done;
  if (done)
    return;
  done = 1;
  rl_readline_name = "kiln";  /* for $if kiln in ~/.inputrc */
  rl_attempted_completion_function = attempt_completion;
  rl_basic_word_break_characters = word_breaks;
  rl_completer_word_break_characters = word_breaks;
  /* With an event hook readline polls its input, and never sees the end of a pipe: the
     hook (needed only for Ctrl-C at a terminal's prompt) is for terminals only. */
  if (isatty(STDIN_FILENO))
    rl_event_hook = prompt_event_hook;
  /* Tab after a partial completion lists the candidates at once (~/.inputrc may say otherwise). */
  rl_variable_bind("show-all-if-unmodified", "on");
}

/* kiln.readline.readline(prompt) -> line | nil (end of input) | nil, "interrupted" (Ctrl-C) */
static int lrl_readline(lua_State *L)
{
  const char *prompt = luaL_optstring(L, 1, "kiln> ");
  readline_setup();
  history_load();
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint_prompt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  prompt_interrupted = 0;
  interrupt_done(L);   /* back at the prompt: an interrupt of the last evaluation is through */
  completion_L = L;
  char *line = readline(prompt);
  completion_L = NULL;
  /* Back to evaluating: Ctrl-C interrupts Lua again (the handler may have been reset
     to the default by an earlier interrupt, so install it rather than restore `old`). */
  if (old.sa_handler == SIG_DFL || old.sa_handler == on_sigint_eval)
    install_eval_sigint();
  else
    sigaction(SIGINT, &old, NULL);
  candidates_clear();
  if (prompt_interrupted) {
    free(line);
    lua_pushnil(L);
    lua_pushliteral(L, "interrupted");
    return 2;
  }
  if (line == NULL) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushstring(L, line);
  free(line);
  return 1;
}

/* kiln.readline.interrupt_caught(): the REPL's message handler has a Ctrl-C's "interrupted"
   error (or another): an interrupt is through and is not raised again. */
static int lrl_interrupt_caught(lua_State *L)
{
  interrupt_done(L);
  return 0;
}

/* kiln.readline.interrupt_after(seconds): after that many seconds (a whole number, at least 1),
   the running Lua code gets the error "timed out" as it would "interrupted" on Ctrl-C; 0 cancels. */
static int lrl_interrupt_after(lua_State *L)
{
  lua_Number s = luaL_checknumber(L, 1);
  if (!(s >= 0 && s <= 1e6))
    return luaL_argerror(L, 1, "seconds from 0 to 1e6");
  unsigned secs = (unsigned)s;
  if (secs == 0 && s > 0)
    secs = 1;
  alarm(0);
  timeout_stage = secs > 0 ? 1 : 0;
  if (secs > 0)
    alarm(secs);
  return 0;
}

/* kiln.readline.history_file() -> path | nil */
static int lrl_history_file(lua_State *L)
{
  history_locate();
  if (history_path[0] == '\0')
    lua_pushnil(L);
  else
    lua_pushstring(L, history_path);
  return 1;
}

static int luaopen_kiln_readline(lua_State *L)
{
  static const luaL_Reg functions[] = {
    {"readline", lrl_readline},
    {"add_history", lrl_add_history},
    {"save_history", lrl_save_history},
    {"history_file", lrl_history_file},
    {"interrupt_caught", lrl_interrupt_caught},
    {"interrupt_after", lrl_interrupt_after},
    {NULL, NULL}};
  lua_newtable(L);
  luaL_register(L, NULL, functions);
  return 1;
}

/* ---- command line ---- */

struct options {
  int script;       /* argv index of the script (or "-"), 0 when none */
  int command;      /* argv index of a subcommand word (kiln launch ...), 0 when none */
  int interactive;  /* -i */
  int has_code;     /* some -e or -l */
  int version, help;
};

/* Subcommands: `kiln WORD args...` runs require(module).main(arg), arg[1..] being the words after
   WORD; the number it returns is the exit status. A script of the same name runs as `kiln ./WORD`. */
static const struct { const char *word, *module; } commands[] = {{"launch", "kiln.launch"}, {"nb", "kiln.nb"}};

/* Reads the options; -1 on a bad one. Like luajit: options stop at the script name. */
static int collect_options(int argc, char **argv, struct options *o)
{
  memset(o, 0, sizeof *o);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || strcmp(a, "-") == 0) {
      for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
        if (strcmp(a, commands[c].word) == 0) o->command = i;
      o->script = i;
      return 0;
    }
    if (strcmp(a, "--") == 0) {
      o->script = i + 1 < argc ? i + 1 : 0;
      return 0;
    }
    if (strcmp(a, "--version") == 0 || strcmp(a, "-v") == 0) {
      o->version = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      o->help = 1;
    } else if (strcmp(a, "-i") == 0) {
      o->interactive = 1;
    } else if ((a[1] == 'e' || a[1] == 'l') && a[2] == '\0') {
      if (++i >= argc) {
        fprintf(stderr, "%s: '%s' needs an argument\n", progname, a);
        return -1;
      }
      o->has_code = 1;
    } else if ((a[1] == 'e' || a[1] == 'l') && a[2] != '\0') {
      o->has_code = 1;  /* -e'code' in one word */
    } else {
      fprintf(stderr, "%s: unknown option '%s'\n", progname, a);
      return -1;
    }
  }
  return 0;
}

/* The global `arg`: arg[0] the script, arg[1..] its arguments, arg[-1..] what came before. */
static void create_arg_table(lua_State *L, int argc, char **argv, int script)
{
  int first = script > 0 ? script : argc;
  lua_createtable(L, argc - first, first);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - first);
  }
  lua_setglobal(L, "arg");
}

static int run_string(lua_State *L, const char *code)
{
  int status = luaL_loadbuffer(L, code, strlen(code), "=(command line)");
  if (status == 0)
    status = docall(L, 0, 0);
  return report(L, status);
}

/* require name, and set the global name to what it returns (as lua -l does). */
static int run_library(lua_State *L, const char *name)
{
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  int status = docall(L, 1, 1);
  if (status == 0)
    lua_setglobal(L, name);
  return report(L, status);
}

/* Runs the -e and -l options in order. */
static int run_options(lua_State *L, int argc, char **argv, int stop)
{
  for (int i = 1; i < stop; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || (a[1] != 'e' && a[1] != 'l'))
      continue;
    const char *value = a[2] != '\0' ? a + 2 : argv[++i];
    int status = a[1] == 'e' ? run_string(L, value) : run_library(L, value);
    if (status != 0)
      return status;
  }
  return 0;
}

/* Runs argv[script] (stdin for "-" or script 0) with arg[1..] as `...`. */
static int run_script(lua_State *L, int argc, char **argv, int script)
{
  const char *fname = script > 0 && strcmp(argv[script], "-") != 0 ? argv[script] : NULL;
  int status = luaL_loadfile(L, fname);
  if (status != 0)
    return report(L, status);
  int narg = 0;
  for (int i = script + 1; script > 0 && i < argc; i++, narg++)
    lua_pushstring(L, argv[i]);
  return report(L, docall(L, narg, 0));
}

/* Runs the subcommand at argv[command]: require(module).main(arg). */
static int run_command(lua_State *L, char **argv, int command)
{
  const char *module = NULL;
  for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
    if (strcmp(argv[command], commands[c].word) == 0) module = commands[c].module;
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  int status = docall(L, 1, 1);
  if (status != 0)
    return report(L, status);
  lua_getfield(L, -1, "main");
  lua_remove(L, -2);
  lua_getglobal(L, "arg");
  status = docall(L, 1, 1);
  if (status != 0)
    return report(L, status);
  int code = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return code;
}

/* Loads the kiln library into the global `kiln`, and kiln.help when kiln has none yet. */
static int load_kiln(lua_State *L)
{
  lua_getglobal(L, "require");
  lua_pushliteral(L, "kiln");
  int status = docall(L, 1, 1);
  if (status != 0) {
    /* Ctrl-C while the library loads is an interrupt, not a library that cannot be loaded */
    if (!interrupt_raised)
      fprintf(stderr, "%s: could not load the kiln library:\n", progname);
    return report(L, status);
  }
  lua_setglobal(L, "kiln");
  /* A broken help module must not stop scripts from running: under pcall, errors ignored. */
  static const char add_help[] =
    "pcall(function()\n"
    "  local help = require('kiln.help').help\n"
    "  if type(kiln) == 'table' and rawget(kiln, 'help') == nil then rawset(kiln, 'help', help) end\n"
    "end)\n";
  if (luaL_loadbuffer(L, add_help, sizeof add_help - 1, "=kiln") == 0)
    lua_pcall(L, 0, 0, 0);
  else
    lua_pop(L, 1);
  return 0;
}

/* The REPL: require("kiln.repl").run(readline, add_history), then save the history. */
static int run_repl(lua_State *L)
{
  if (isatty(STDIN_FILENO))
    printf("kiln %s (%s) -- ?x or help(x) for help, Ctrl-D to quit\n", KILN_VERSION_STRING, LUAJIT_VERSION);
  fflush(stdout);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "kiln.repl");
  int status = docall(L, 1, 1);
  if (status != 0)
    return report(L, status);
  lua_getfield(L, -1, "run");
  lua_remove(L, -2);
  repl_mode = 1;
  luaopen_kiln_readline(L);
  lua_getfield(L, -1, "readline");
  lua_getfield(L, -2, "add_history");
  lua_remove(L, -3);
  return report(L, docall(L, 2, 0));
}

/* `kiln nb ...`: require("kiln.nb").main(arg) with arg[1..] the words after "nb"; its result is
   the exit status. */
/* Everything after the state exists; returns the exit status. */
static int run(lua_State *L, int argc, char **argv, const struct options *o)
{
  luaL_openlibs(L);
  set_package_path(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_kiln_readline);
  lua_setfield(L, -2, "kiln.readline");
  lua_pop(L, 2);
  if (load_kiln(L) != 0)
    return 1;
  create_arg_table(L, argc, argv, o->script);
  /* with -i, an error in the -e code or the script is reported and the REPL starts anyway, with
     what ran so far (its globals) there to look at */
  int failed = run_options(L, argc, argv, o->script > 0 ? o->script : argc) != 0;
  if (failed && !o->interactive)
    return 1;
  if (o->command > 0)
    return run_command(L, argv, o->command);
  int stdin_tty = isatty(STDIN_FILENO);
  if (!failed && (o->script > 0 || (!o->has_code && !o->interactive && !stdin_tty))) {
    failed = run_script(L, argc, argv, o->script) != 0;
    if (failed && !o->interactive)
      return 1;
  }
  if (o->interactive || (o->script == 0 && !o->has_code && stdin_tty))
    return run_repl(L) != 0 || failed;
  return 0;
}

int main(int argc, char **argv)
{
  struct options o;
  if (collect_options(argc, argv, &o) != 0) {
    print_usage(stderr);
    return 1;
  }
  if (o.help) {
    print_usage(stdout);
    return 0;
  }
  if (o.version) {
    /* kiln_version() is the library's; calling it also keeps libkiln linked for ffi.C. */
    printf("kiln %s (%s)\n", kiln_version(), LUAJIT_VERSION);
    printf("cpu: %s (%s, family %d, model %d)\n", kiln_cpu_name(), kiln_cpu_vendor(), kiln_cpu_family(), kiln_cpu_model());
    printf("cpu features: %s\n", kiln_cpu_features());
    printf("cpu level: %s\n", kiln_cpu_level());
    if (kiln_cpu_level_check() != KILN_OK) printf("cpu level note: %s\n", kiln_error_message());
    printf("blas: %s, core %s\n", kiln_blas_name(), kiln_blas_core());
    if (*kiln_blas_note()) printf("blas note: %s\n", kiln_blas_note());
    printf("f32 products: %s\n", strcmp(kiln_cpu_f32_gemm(), "kiln") == 0 ? "kiln's own kernel (2+ rows, 16+ columns), the BLAS for the rest" : "the BLAS");
    printf("bf16 products: %s\n", kiln_cpu_bf16_products());
    return 0;
  }
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "%s: cannot create the Lua state: not enough memory\n", progname);
    return 1;
  }
  global_L = L;
  install_signal_handlers();
  int status = run(L, argc, argv, &o);
  /* A rank of a distributed job: a clean end lets the others finish too; a failed one ends the
     whole job at once, rather than leaving the others to wait for it until their deadline. */
  if (kiln_dist_is_initialized()) {
    if (status != 0) {
      fflush(stdout);
      fflush(stderr);
      kiln_dist_abort(status);
    }
    if (kiln_dist_finalize() != 0)
      fprintf(stderr, "%s: %s\n", progname, kiln_error_message());
  }
  lua_close(L);
  return status;
}
