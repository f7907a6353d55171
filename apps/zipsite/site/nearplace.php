<?php
// GET /near/N: people within 10 miles of place N, as a document of the
// coherent cache (docs/CACHE.md): mod_ccache takes N, the last path
// segment, as the document number, and ccproxy caches the page under the
// version ccappd publishes for it (Apache: AliasMatch ^/near/([0-9]+)$ to
// this file). The same page as near.php?zip=<N's zip>&miles=10.
declare(strict_types=1);
require __DIR__ . '/lib.php';

if (!preg_match('#^/near/([1-9][0-9]{0,8})$#D', parse_url($_SERVER['REQUEST_URI'] ?? '', PHP_URL_PATH) ?? '', $m)) {
    fail(400, 'the path must be /near/N with N a place number, e.g. /near/42');
}
$db = db();
$q = $db->prepare('SELECT zip FROM place WHERE id = ?');
$q->execute([(int) $m[1]]);
$zip = $q->fetchColumn();
if ($zip === false) {
    fail(404, "no place number {$m[1]}");
}
near_page($db, (string) $zip, '10', 10.0);
