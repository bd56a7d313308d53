#include "child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>

namespace cocemu::testing {

std::vector<std::string> split_args(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

ChildOutcome run_child(const std::vector<std::string>& argv, double deadline_s,
                       const std::vector<std::string>& env) {
  ChildOutcome o;
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return o;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) return o;
  if (pid == 0) {
    setpgid(0, 0);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    for (const std::string& e : env)
      putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipefd[1]);
  const auto deadline = t0 + std::chrono::duration<double>(deadline_s);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      o.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    if (poll(&p, 1, int(std::min<long long>(left, 200))) > 0) {
      const ssize_t n = read(pipefd[0], buf, sizeof buf);
      if (n <= 0) break;  // the child closed stderr: it is ending
      if (o.err.size() < (1u << 20)) o.err.append(buf, std::size_t(n));
    }
  }
  int status = 0;
  rusage ru{};
  // The child may still run after closing stderr: wait for it, within the deadline.
  for (;;) {
    const pid_t w = wait4(pid, &status, WNOHANG, &ru);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() >= deadline && !o.timed_out) {
      o.timed_out = true;
      kill(-pid, SIGKILL);
    }
    usleep(2000);
  }
  close(pipefd[0]);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.peak_rss_mb = double(ru.ru_maxrss) / 1024.0;
  o.exit = o.timed_out           ? 124
           : WIFEXITED(status)   ? WEXITSTATUS(status)
           : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                 : -1;
  return o;
}

}  // namespace cocemu::testing
