// Judges one scenario run of the official conformance suite from the
// `checks.json` it wrote (`conformance server ... -o DIR`).
//
//   node conformance-summary.mjs SCENARIO DIR SUITE_EXIT_CODE
//
// Prints `PASS|FAIL SCENARIO: S passed, F failed, W warnings` and, indented,
// every FAILURE and WARNING check; exits 1 when the scenario fails. A scenario
// fails on any FAILURE or WARNING, on a non-zero exit of the suite, when no
// results were written, and — for server-sse-polling — when the suite did not
// actually see a resume (its `server-sse-disconnect-resume` check must be
// SUCCESS: INFO there means the server never closed the stream mid-call).
// Exit code: 0 pass, 1 fail, 2 fail without results (show the suite's log).

import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';

const [scenario, dir, exitCode] = process.argv.slice(2);
const strict = scenario === 'server-sse-polling';

function findChecks(root) {
    const found = [];
    const walk = d => {
        let entries = [];
        try {
            entries = readdirSync(d);
        } catch {
            return;
        }
        for (const e of entries) {
            const p = join(d, e);
            if (statSync(p).isDirectory()) walk(p);
            else if (e === 'checks.json') found.push(p);
        }
    };
    walk(root);
    return found;
}

const files = findChecks(dir);
const problems = [];
let checks = [];
let noResults = false;
if (files.length !== 1) {
    noResults = true;
    problems.push(`expected one checks.json under ${dir}, found ${files.length} (the suite crashed or timed out?)`);
} else {
    try {
        checks = JSON.parse(readFileSync(files[0], 'utf8'));
    } catch (e) {
        noResults = true;
        problems.push(`unreadable ${files[0]}: ${e.message}`);
    }
}
const by = s => checks.filter(c => c.status === s);
const [ok, failed, warned] = [by('SUCCESS'), by('FAILURE'), by('WARNING')];
if (exitCode !== '0') problems.push(`the suite exited with ${exitCode}`);
if (failed.length) problems.push(`${failed.length} FAILURE check(s)`);
if (warned.length) problems.push(`${warned.length} WARNING check(s) (none allowed)`);
if (strict && checks.length) {
    const resume = checks.find(c => c.id === 'server-sse-disconnect-resume');
    if (!resume) problems.push('no server-sse-disconnect-resume check: the suite did not get to the resume');
    else if (resume.status !== 'SUCCESS') problems.push(`server-sse-disconnect-resume is ${resume.status}, not SUCCESS: ${resume.details?.message ?? resume.description}`);
}
if (checks.length && !ok.length) problems.push('no SUCCESS check at all');

const pass = problems.length === 0;
console.log(`${pass ? 'PASS' : 'FAIL'} ${scenario}: ${ok.length} passed, ${failed.length} failed, ${warned.length} warnings${pass ? '' : ` -- ${problems.join('; ')}`}`);
for (const c of [...failed, ...warned]) {
    const detail = c.errorMessage ?? c.details?.message ?? '';
    console.log(`    ${c.status} [${c.id}] ${c.description}${detail ? ` -- ${detail}` : ''}`);
}
if (strict) {
    // The evidence of the resume: the events the suite saw, and the resume check.
    for (const c of checks.filter(c => ['stream-closed', 'server-sse-disconnect-resume', 'server-sse-priming-event', 'server-sse-retry-field'].includes(c.id) && c.status !== 'FAILURE' && c.status !== 'WARNING')) {
        console.log(`    ${c.status} [${c.id}] ${c.description}${c.details ? ` ${JSON.stringify(c.details)}` : ''}`);
    }
}
process.exit(pass ? 0 : noResults ? 2 : 1);
