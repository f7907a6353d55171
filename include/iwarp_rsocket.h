/*
 * iwarp_rsocket.h: sockets over iWARP with the calls of librdmacm's
 * <rdma/rsocket.h> (libiwarp_rsocket.so, crates/iwarp-rsocket).
 *
 * Streams speak the rsockets protocol (iWARP mode) over MPA/TCP, so they
 * interoperate with rsocket programs on hosts with kernel siw or an iWARP
 * RNIC. Descriptors are real descriptor numbers: a connected rsocket's
 * number refers to a readiness descriptor, readable when a read would not
 * block and writable when a write would not, so rpoll/rselect are poll and
 * select, and epoll works on it too. Never read or write such a
 * descriptor with read(2)/write(2): use the r* calls.
 *
 * Every call returns -1 and sets errno on error, like its socket
 * counterpart. rconnect blocks until the connection is up or failed, even
 * on a non-blocking socket (it then returns 0, never EINPROGRESS).
 * raccept skips connections that are not rsockets clients.
 *
 * Hand-written (rfcntl is variadic, as in rsocket.h); tests/c/rsocket/
 * compiles against it with -Wall -Wextra -Werror.
 */
#ifndef IWARP_RSOCKET_H
#define IWARP_RSOCKET_H

#include <poll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

int rsocket(int domain, int type, int protocol);
int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen);
int rlisten(int socket, int backlog);
int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen);
int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen);
int rshutdown(int socket, int how);
int rclose(int socket);

ssize_t rrecv(int socket, void *buf, size_t len, int flags);
ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags,
                  struct sockaddr *src_addr, socklen_t *addrlen);
ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags);
ssize_t rsend(int socket, const void *buf, size_t len, int flags);
ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
                const struct sockaddr *dest_addr, socklen_t addrlen);
ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags);
ssize_t rread(int socket, void *buf, size_t count);
ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt);
ssize_t rwrite(int socket, const void *buf, size_t count);
ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt);

int rpoll(struct pollfd *fds, nfds_t nfds, int timeout);
int rselect(int nfds, fd_set *readfds, fd_set *writefds,
            fd_set *exceptfds, struct timeval *timeout);

int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen);
int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen);

int rsetsockopt(int socket, int level, int optname,
                const void *optval, socklen_t optlen);
int rgetsockopt(int socket, int level, int optname,
                void *optval, socklen_t *optlen);
int rfcntl(int socket, int cmd, ... /* arg */);

/*
 * rsocket's own option level, as in <rdma/rsocket.h>. Only RDMA_IOMAPSIZE
 * is honoured: set it (an int, entries) before rconnect, or on the
 * listening socket before raccept, to let the peer riomap that many
 * buffers toward this socket.
 */
#ifndef SOL_RDMA
#define SOL_RDMA 0x10000
enum {
    RDMA_SQSIZE,
    RDMA_RQSIZE,
    RDMA_INLINE,
    RDMA_IOMAPSIZE,
    RDMA_ROUTE
};
#endif

/*
 * Direct data placement (rsocket.h's iomap calls). riomap maps buf for the
 * peer's riowrite at offset (-1: at buf's address) and returns the offset;
 * prot must be PROT_WRITE; buf must stay valid until riounmap or rclose.
 * riowrite writes straight from buf into the peer's mapping at offset (zero
 * copy) and tells the peer nothing: agree on a completion signal (a marker
 * byte, or an rsend after the writes). Errors: EINVAL (outside the peer's
 * mappings, bad arguments, unknown mapping), ENOMEM (the peer's iomap table
 * is full or absent), ECONNRESET, EAGAIN. riowrite returns (size_t) -1 on
 * error, as in rsocket.h.
 */
off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset);
int riounmap(int socket, void *buf, size_t len);
size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags);

#ifdef __cplusplus
}
#endif

#endif /* IWARP_RSOCKET_H */
