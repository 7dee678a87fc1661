// Atomic writes of the files users care about (checkpoints, results, caches, traces): replaced
// whole or not at all, with the file's permissions kept, and destinations that cannot be written
// refused up front, naming what the file is for and why.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/atomic_file.h"

namespace quiver {
namespace {

// Atomic writes replace the file whole and leave no temporary beside it; a destination that could
// not be written is refused up front, naming what it is for and why.
TEST(AtomicFile, ReplacesWholeAndRefusesBadDestinations) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / cat("quiver-atomic-", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.md").string();
  write_file_atomically(path, "first, and longer", "results");
  write_file_atomically(path, "second", "results");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "second");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1)
      << "a temporary file was left behind";
  EXPECT_NO_THROW(check_writable(path, "--output"));                    // an existing file
  EXPECT_NO_THROW(check_writable((dir / "new.md").string(), "--output"));  // a new one
  auto message = [](const std::string& target) {
    try {
      check_writable(target, "--output");
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(""), "--output: empty file name");
  // The write itself says so too, for callers that did not check first (it said "cannot move
  // './.quiver-tmp.N' to ''").
  auto write_message = [](const std::string& target) {
    try {
      write_file_atomically(target, "text", "checkpoint");
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("written");
  };
  EXPECT_EQ(write_message(""), "checkpoint: empty file name");
  EXPECT_EQ(write_message(dir.string() + "/"), cat("checkpoint: '", dir.string(), "/' names a directory, not a file"));
  EXPECT_EQ(message(dir.string()), cat("--output: '", dir.string(), "' is a directory"));
  // rename() would replace a device or a pipe with a regular file.
  const std::string pipe = (dir / "pipe").string();
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  EXPECT_EQ(message(pipe), cat("--output: '", pipe, "' is not a regular file"));
  EXPECT_EQ(message("/dev/null"), "--output: '/dev/null' is not a regular file");
  // The write refuses it too (as root, its rename would put a regular file in place of /dev/null),
  // and the pipe stays.
  EXPECT_EQ(write_message(pipe), cat("checkpoint: '", pipe, "' is not a regular file"));
  EXPECT_TRUE(std::filesystem::is_fifo(pipe));
  std::filesystem::remove(pipe);
  // A directory where no file can be created (root may write /proc by its permission bits).
  if (std::filesystem::is_directory("/proc")) {
    const std::string refused = message("/proc/quiver-results.md");
    EXPECT_NE(refused.find("cannot create files in '/proc'"), std::string::npos) << refused;
  }
  // A link is written through: its target gets the text, and the link stays a link.
  const std::filesystem::path target = dir / "target.md", link = dir / "link.md";
  std::filesystem::create_symlink("target.md", link);
  EXPECT_NO_THROW(check_writable(link.string(), "--output"));  // a dangling link: its target is created
  write_file_atomically(link.string(), "through the link", "results");
  EXPECT_TRUE(std::filesystem::is_symlink(std::filesystem::symlink_status(link)));
  std::ifstream through(target);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(through)), std::istreambuf_iterator<char>()), "through the link");
  // What a write replaces, for writers that lock its directory (the profile cache): the link's
  // target in another directory, not the link's own directory.
  std::filesystem::create_directories(dir / "elsewhere");
  const std::filesystem::path far_link = dir / "elsewhere" / "far.md";
  std::filesystem::create_symlink("../target.md", far_link);
  EXPECT_EQ(std::filesystem::weakly_canonical(
                std::filesystem::path(atomic_write_target(far_link.string(), "results")).parent_path()),
            std::filesystem::weakly_canonical(dir));
  EXPECT_EQ(atomic_write_target(target.string(), "results"), target.string());
  // A process's open file (where /dev/stdout and /dev/fd/N lead) cannot be replaced by a rename:
  // through a link of ours, /dev/stdout, /dev/fd/1 (a path through a linked directory) or given
  // directly.
  const std::filesystem::path out = dir / "stdout";
  std::filesystem::create_symlink("/proc/self/fd/1", out);
  for (const std::string& stream : {out.string(), std::string("/dev/stdout"), std::string("/dev/fd/1"),
                                    std::string("/proc/self/fd/1")}) {
    if (!std::filesystem::exists(std::filesystem::symlink_status(stream))) continue;  // no /dev/fd here
    const std::string refused = message(stream);
    EXPECT_NE(refused.find("a process's open file"), std::string::npos) << stream << ": " << refused;
  }
  // A name longer than the file system allows is refused before any work, not after it.
  const std::string long_name = (dir / std::string(300, 'a')).string();
  const std::string too_long = message(long_name);
  EXPECT_NE(too_long.find("the file name is longer than"), std::string::npos) << too_long;
  // The longest name allowed is written: the temporary name does not grow with it.
  const std::string longest = (dir / std::string(255, 'b')).string();
  if (::pathconf(dir.c_str(), _PC_NAME_MAX) >= 255) {
    EXPECT_NO_THROW(check_writable(longest, "--output"));
    EXPECT_NO_THROW(write_file_atomically(longest, "long", "results"));
  }
  const std::string missing = (dir / "no" / "x.md").string();
  EXPECT_EQ(message(missing),
            cat("--output: cannot write '", missing, "': directory '", (dir / "no").string(), "' does not exist"));
  // A directory name too long to look up is not a missing directory: the lookup's own reason is
  // given (ENAMETOOLONG), for a component and for a whole path past PATH_MAX.
  const std::string long_component = (dir / std::string(300, 'c') / "x.md").string();
  EXPECT_EQ(message(long_component), cat("--output: cannot write '", long_component, "': directory '",
                                         (dir / std::string(300, 'c')).string(), "': ",
                                         std::make_error_code(std::errc::filename_too_long).message()));
  std::string long_path = dir.string();
  while (long_path.size() <= 4096) long_path += "/" + std::string(200, 'd');
  const std::string refused_long_path = message(long_path + "/x.md");
  EXPECT_NE(refused_long_path.find(std::make_error_code(std::errc::filename_too_long).message()), std::string::npos)
      << refused_long_path;
  EXPECT_EQ(refused_long_path.find("does not exist"), std::string::npos) << refused_long_path;
  // A path through a file is not a missing directory.
  const std::string through_a_file = (dir / "out.md" / "x.md").string();
  EXPECT_EQ(message(through_a_file), cat("--output: cannot write '", through_a_file, "': directory '",
                                         (dir / "out.md").string(), "' is not a directory"));
  // A file made read-only (no write bit at all) is kept, also by root, whom access() lets write it.
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::group_read);
  EXPECT_EQ(message(path), cat("--output: cannot replace '", path, "': it is read-only"));
  // The write itself refuses it too (a library caller need not have asked first), and the file
  // keeps its text.
  EXPECT_EQ(write_message(path), cat("checkpoint: cannot replace '", path, "': it is read-only"));
  {
    std::ifstream kept(path);
    EXPECT_EQ(std::string((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>()), "second");
  }
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_NO_THROW(check_writable(path, "--output"));
  EXPECT_THROW(write_file_atomically(missing, "x", "results"), Error);
  std::filesystem::remove_all(dir);
}

// A writer stopped mid-write (here by the file-size limit's SIGXFSZ; a Ctrl-C during a save is the
// same) leaves neither a half-written target nor a hidden temporary file as large as what it wrote.
TEST(AtomicFile, AWriterStoppedMidWriteLeavesNothingBehind) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / cat("quiver-atomic-stop-", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.ckpt").string();
  write_file_atomically(path, "the last good one", "checkpoint");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const struct rlimit limit{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      write_file_atomically(path, std::string(4 << 20, 'x'), "checkpoint");
    } catch (...) {
    }
    ::_exit(0);  // not reached: SIGXFSZ ends the write
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) << "status " << status;
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"model.ckpt"});
  std::ifstream in(path);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), "the last good one");
  std::filesystem::remove_all(dir);
}

// In a sticky directory (/tmp) only the file's owner, the directory's owner or root may replace a
// file: check_writable refuses the others up front (the rename would fail after the whole run).
TEST(AtomicFile, AnotherUsersFileInAStickyDirectoryIsRefused) {
  const unsigned sticky = S_IFDIR | S_ISVTX | 0777, plain = S_IFDIR | 0777;
  EXPECT_FALSE(may_replace_in(sticky, 0, 1000, 1001));
  EXPECT_TRUE(may_replace_in(sticky, 0, 1001, 1001));     // the file's owner
  EXPECT_TRUE(may_replace_in(sticky, 1001, 1000, 1001));  // the directory's owner
  EXPECT_TRUE(may_replace_in(sticky, 0, 1000, 0));        // root
  EXPECT_TRUE(may_replace_in(plain, 0, 1000, 1001));      // not sticky: the directory's write bit decides
}

// A replaced file keeps its permissions: a checkpoint its owner made private (0600) stays private,
// and a shared one (0664) stays shared. (The new file was always created 0644.) A new file gets
// the usual 0644 less the umask.
TEST(AtomicFile, AReplacedFileKeepsItsPermissions) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / cat("quiver-atomic-mode-", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.ckpt").string();
  auto mode_of = [](const std::string& file) {
    struct stat info{};
    EXPECT_EQ(::stat(file.c_str(), &info), 0) << file;
    return info.st_mode & 07777;
  };
  write_file_atomically(path, "first", "checkpoint");
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(mode_of(path), 0644u & ~mask);
  for (mode_t mode : {0600u, 0664u, 0640u}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    write_file_atomically(path, "again", "checkpoint");
    EXPECT_EQ(mode_of(path), mode) << std::oct << mode;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace quiver
